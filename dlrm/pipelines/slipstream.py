"""Slipstream's train pipeline (Maboud et al., 2024): skip the work embedding rows that stopped
changing no longer need. It wraps the placement's own pipeline (the plain step, Hotline's), so it
works over every placement and model.

- Tracked rows are a placement plan's hot rows (`embeddings/staleness.py` measures their drift,
  sets the threshold and the stale set); every `interval` steps they are snapshotted (read through
  the collection contract's `rows_of`, so from whichever tier holds them).
- `drop`: an input whose every lookup is a stale row is left out; `RefillingStream`
  (dlrm/pipelines/slipstream_inputs.py) refills the mini-batches from the inputs after it. At every
  snapshot the stream restarts from the last trained input, so what was read ahead is decided
  again with the new stale set (the wrapped pipeline sees a new iterator and drops what it staged).
- `freeze`: inputs stay, but their stale lookups leave the mini-batch's sparse features (the
  collection neither updates those rows nor, in hybrid placements, moves them) and are pooled
  instead from the snapshot, which is exactly their value since they became stale; a hook on the
  collection adds that sum to its output. Their gradients are summed, scaled as the optimizer
  would (SGD: 1, Adagrad: 1 / sqrt(state)), and taken as their would-be drift at the next
  snapshot, so a frozen row that would move again is thawed.
- `control="random"`: the same machinery, but drop leaves out inputs at random (share
  `target_skip`) and freeze freezes as many rows as are stale, chosen at random: the benefit of
  choosing by staleness measured against chance.
- `normalize`: the pooled embedding of every feature scaled to unit L2 norm (training and
  evaluation alike), the paper's "feature normalization" against the shift that skipping causes.

Everything that decides which inputs and rows are skipped (snapshots, drift, thresholds, the
stream's cursor, the would-be changes) is in `state_dict()`, so a resumed run continues exactly.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from dlrm.pipelines.base import StepResult, TrainPipeline
from dlrm.pipelines.slipstream_inputs import Cursor, Decision, RefillingStream, Yielded, random_kept
from dlrm.settings.placement import SlipstreamConfig
from embeddings.kjt_ops import in_feature_order
from embeddings.plan import row_bytes
from embeddings.staleness import StalenessTracker
from embeddings.torch_tbe import segment_sum_rows

MODES = ("drop", "freeze")
CONTROLS = ("staleness", "random")
_COUNTS = ("samples_trained", "samples_skipped", "lookups_dropped", "lookups_frozen")


@dataclass
class _Frozen:
    """A mini-batch's stale lookups (freeze): their tracked rows, bags and what remains."""

    slots: torch.Tensor  # tracked row of each stale lookup
    offsets: torch.Tensor  # [bags + 1] over the stale lookups, table-major bags
    rows: int  # KJT rows
    fresh_lookups: int  # lookups left in the mini-batch's features


class _FrozenRows(torch.autograd.Function):
    """Sum-pooled lookups of frozen rows; backward adds each row's gradient (scaled as its
    optimizer would) to `would_be` instead of updating it."""

    @staticmethod
    def forward(ctx, anchor, table, slots, offsets, would_be, scale):  # type: ignore[override]
        ctx.save_for_backward(slots, offsets)
        ctx.would_be, ctx.scale = would_be, scale
        return F.embedding_bag(slots, table, offsets[:-1], mode="sum")

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        slots, offsets = ctx.saved_tensors
        rows, g = segment_sum_rows(slots, offsets, grad.float())
        if ctx.scale is not None:
            s = ctx.scale[rows]
            g = g * (s if s.dim() == 2 else s.unsqueeze(1))
        ctx.would_be.index_add_(0, rows, g)
        return None, None, None, None, None, None


class SlipstreamTrainPipeline(TrainPipeline):
    def __init__(
        self,
        inner: TrainPipeline,
        model: torch.nn.Module,
        tracker: StalenessTracker,
        settings: SlipstreamConfig,
        batch_size: int,
        batches_per_epoch: int,
        device: torch.device,
        *,
        seed: int,
        learning_rate: float,
        profiled: frozenset[int] = frozenset(),
    ) -> None:
        """`settings`: the run's `--slipstream-*` section; `learning_rate`: the sparse
        optimizer's, for freeze's would-be drift; `profiled`: the source batches (indices in an
        epoch) the access profile read: their inputs' rows are all tracked (they are the rows
        the profile saw), so the threshold's sample avoids them."""
        if settings.mode not in MODES or settings.control not in CONTROLS:
            raise ValueError(f"slipstream: unknown mode or control in {settings}")
        self.inner, self.hook = inner, inner.hook
        self.coll = model.embeddings
        self.tracker, self.settings, self.device = tracker, settings, device
        self.seed, self.learning_rate, self.profiled = seed, learning_rate, profiled
        self.freeze = settings.mode == "freeze"
        if len(set(self.coll.dims)) != 1:
            raise ValueError("slipstream: every embedding table must have the same width")
        self.dim = self.coll.dims[0]
        self.row_bytes = row_bytes(self.dim, self.coll.optimizer)
        self.dense_flops = 6 * sum(p.numel() for p in model.dense_parameters())  # fwd + bwd
        self.stream = RefillingStream(
            batch_size, batches_per_epoch, self._decide, self._split if self.freeze else None
        )
        self.epoch, self.steps = -1, 0
        self.counts = dict.fromkeys(_COUNTS, 0)
        self.history: list[list[float]] = []  # [step, threshold, stale share, median drift]
        self._source = self._batches = None
        self._resume_cursor: Cursor | None = None
        self._active = False
        self._anchor = torch.zeros(0, device=device, requires_grad=True)
        self._table: torch.Tensor | None = None  # freeze: the tracked rows as frozen
        self._scale: torch.Tensor | None = None
        self.would_be: torch.Tensor | None = None
        if self.freeze:
            self.coll.register_forward_hook(self._add_frozen)
        if settings.normalize:
            self.coll.register_forward_hook(_normalize)

    # --- the step -------------------------------------------------------------------------------

    def progress(self, batches) -> StepResult:
        if batches is not self._source:  # a new epoch, or the one a resumed run continues
            self._source = batches
            cursor, self._resume_cursor = self._resume_cursor, None
            if cursor is None:
                self.epoch, cursor = self.epoch + 1, Cursor()
            self.stream.open(batches, cursor)
            self._restart()
        if self.tracker.snapshots == 0:
            self._snapshot()  # the reference the first drift is measured against
        before = self.stream.cursor
        try:
            out = self.inner.progress(self._batches)
        except StopIteration:  # everything left in the epoch was dropped
            y = self.stream.finish()
            if y is not None:
                self._count(y)
            raise
        y = self.stream.trained()
        self._count(y)
        self.tracker.count(y.batch.sparse_features)
        self.steps += 1
        if self.steps % self.settings.interval == 0:
            self._snapshot()
            self._restart()
        elif self.steps == self.settings.warmup:
            self._restart()
        return dataclasses.replace(out, source_batches=y.cursor.batch - before.batch)

    def _restart(self) -> None:
        """Decisions from here on with the current stale set (and warm-up state)."""
        s = self.settings
        warm = self.steps >= s.warmup
        self._active = warm and (s.control == "random" or self.tracker.snapshots >= 2)
        self._batches = self.stream.restart()

    def _count(self, y: Yielded) -> None:
        c = self.counts
        c["samples_trained"] += y.trained
        c["samples_skipped"] += y.dropped
        c["lookups_dropped"] += y.dropped_lookups
        if y.extra is not None:
            c["lookups_frozen"] += int(y.extra.slots.numel())

    # --- which inputs are kept (drop) -------------------------------------------------------------

    def _decide(self, index: int, batch: Batch) -> Decision:
        s = self.settings
        if not self._active or self.freeze:
            return None
        inputs = batch.labels.numel()
        if s.control == "random":
            return random_kept(self.seed, self.epoch, index, inputs, s.target_skip)
        stale, lookups = self.tracker.stale_input_mask(batch.sparse_features, inputs)
        return (~stale, lookups) if stale.any() else None

    # --- frozen rows (freeze) ---------------------------------------------------------------------

    def _split(self, batch: Batch) -> tuple[Batch, _Frozen | None]:
        """The mini-batch without its stale lookups, and those lookups."""
        if not self._active:
            return batch, None
        tr = self.tracker
        lk = tr.lookups(batch.sparse_features, batch.labels.numel())
        stale = tr.stale_lookups(lk)
        if not bool(stale.any()):
            return batch, None
        kjt = in_feature_order(batch.sparse_features, tr.feature_names)
        frozen_len = torch.bincount(lk.bag_of_lookup()[stale], minlength=lk.lengths.numel())
        lengths = kjt.lengths()
        fresh = KeyedJaggedTensor(
            keys=kjt.keys(), values=kjt.values()[(~stale).to(kjt.values().device)],
            lengths=lengths - frozen_len.to(lengths.device, lengths.dtype), stride=lk.rows,
        )  # fmt: skip
        offsets = torch.zeros(frozen_len.numel() + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(frozen_len, 0)
        frozen = _Frozen(lk.slots[stale], offsets, lk.rows, int(fresh.values().numel()))
        return Batch(batch.dense_features, fresh, batch.labels), frozen

    def _add_frozen(self, module, args, output: KeyedTensor) -> KeyedTensor | None:
        """Forward hook on the collection: the frozen lookups' sum added to a training forward."""
        if not (module.training and torch.is_grad_enabled()) or not self.stream.pending:
            return None
        fz: _Frozen | None = self.stream.pending[0].extra
        if fz is None:
            return None
        kjt = args[0]
        if kjt.stride() != fz.rows or kjt.values().numel() != fz.fresh_lookups:
            raise RuntimeError("slipstream: frozen lookups prepared for another mini-batch")
        dev = self._table.device
        pooled = _FrozenRows.apply(
            self._anchor, self._table, fz.slots.to(dev), fz.offsets.to(dev), self.would_be,
            self._scale,
        )  # fmt: skip
        T = len(self.coll.feature_names)
        add = pooled.view(T, fz.rows, self.dim).transpose(0, 1).reshape(fz.rows, T * self.dim)
        return KeyedTensor(
            keys=output.keys(), length_per_key=output.length_per_key(),
            values=output.values() + add.to(output.values().dtype),
        )  # fmt: skip

    # --- snapshots ----------------------------------------------------------------------------------

    def _snapshot(self) -> None:
        tr, s = self.tracker, self.settings
        weights, state = self.coll.rows_of(torch.from_numpy(tr.tables), torch.from_numpy(tr.rows))
        extra = None
        if self.would_be is not None:
            extra = self.would_be.cpu() * self.learning_rate
        raw = self.stream.sample(self.profiled)
        sample = None if raw is None else tr.lookups(raw.sparse_features, raw.labels.numel())
        info = tr.snapshot(weights, state, sample, extra)
        if s.control == "random" and self.freeze:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + tr.snapshots)
            tr.use_random_stale_set(gen)
            info["stale_row_share"] = tr.stale_share
        self.history.append(
            [self.steps, info["threshold"], info["stale_row_share"], info["median_drift"]]
        )
        if self.freeze:
            self._frozen_rows()

    def _frozen_rows(self) -> None:
        """The frozen table (the last snapshot), a fresh would-be accumulator, the scale."""
        tr = self.tracker
        self._table = tr.weights.to(self.device)
        self.would_be = torch.zeros_like(self._table)
        self._scale = None
        if tr.state is not None:
            self._scale = 1.0 / (tr.state.to(self.device).sqrt() + self.coll.optimizer.eps)

    # --- counters and checkpoints -------------------------------------------------------------------

    def counters(self) -> dict:
        c, tr = self.counts, self.tracker
        seen = c["samples_trained"] + c["samples_skipped"]
        saved_lookups = c["lookups_dropped"] + c["lookups_frozen"]
        return {
            "stale_row_share": tr.stale_share,
            "tracked_rows": tr.num_tracked,
            "stale_threshold": None if math.isnan(tr.threshold) else tr.threshold,
            "snapshots": tr.snapshots,
            **{k: c[k] for k in _COUNTS},
            "skipped_input_share": c["samples_skipped"] / seen if seen else 0.0,
            "emb_lookups_saved": saved_lookups,
            # drop: each lookup's read in forward and its row's update (weights + optimizer
            # state read and written; an upper bound: a row looked up twice is updated once);
            # freeze: the update only (the frozen row is still read)
            "emb_bytes_saved": c["lookups_dropped"] * (4 * self.dim + 2 * self.row_bytes)
            + c["lookups_frozen"] * 2 * self.row_bytes,
            # the dense part's forward and backward (2 x 3 x weights per input) and the lookups'
            # pooling, gradient and update (about 4 x dim each)
            "flops_saved": c["samples_skipped"] * self.dense_flops + saved_lookups * 4 * self.dim,
        }

    def summary_parts(self) -> dict[str, dict]:
        """`slipstream`: the counters, and whether the run outlasted the warm-up (before it
        nothing is skipped: a run shorter than it says so rather than a bare 0%)."""
        part = {**self.counters(), "warmup_steps": self.settings.warmup, "steps": self.steps,
                "shorter_than_warmup": self.steps < self.settings.warmup}  # fmt: skip
        return {**self.inner.summary_parts(), "slipstream": part}

    def state_dict(self) -> dict:
        cursor = self.stream.cursor
        out = {
            "epoch": self.epoch, "steps": self.steps,
            "cursor": [cursor.batch, cursor.position],
            "counts": torch.tensor([self.counts[k] for k in _COUNTS], dtype=torch.int64),
            "tracker": self.tracker.state_dict(),
            "history": torch.tensor(self.history, dtype=torch.float64).reshape(-1, 4),
        }  # fmt: skip
        if self.would_be is not None:
            out["would_be"] = self.would_be.cpu()
        return out

    def load_state_dict(self, state: dict) -> None:
        if not state:
            return
        self.epoch, self.steps = int(state["epoch"]), int(state["steps"])
        cursor = Cursor(*map(int, state["cursor"]))
        # at the end of its epoch the trainer goes on with the next one, from its start
        self._resume_cursor = cursor if cursor.batch < self.stream.epoch_batches else None
        self.counts = dict(zip(_COUNTS, (int(v) for v in state["counts"].tolist())))
        self.tracker.load_state_dict(state["tracker"], torch.device("cpu"))
        self.history = state["history"].tolist()
        if self.freeze and self.tracker.weights is not None:
            self._frozen_rows()
            if "would_be" in state:
                self.would_be.copy_(state["would_be"])
        self._source = None


def _normalize(module, args, output: KeyedTensor) -> KeyedTensor:
    """Forward hook: every feature's pooled embedding scaled to unit L2 norm."""
    v = output.values()
    T = len(output.keys())
    x = v.view(v.shape[0], T, -1)
    x = x / torch.linalg.vector_norm(x, dim=2, keepdim=True).clamp(min=1e-6)
    return KeyedTensor(
        keys=output.keys(), length_per_key=output.length_per_key(), values=x.reshape(v.shape)
    )

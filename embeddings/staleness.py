"""Slipstream's staleness tracking (Maboud, Adnan, Mahajan, Nair, 2024): which embedding rows
stopped changing, and which inputs only look up such rows.

Tracked rows are the hot rows of a placement plan (the rows worth watching: they take most of the
lookups, and their number is bounded by the plan's device budget, so the snapshots' memory is
too). Every interval the caller passes the tracked rows' current weights to `snapshot`:

- drift per row since the previous snapshot: `relative` (default) ||w - w_prev|| / ||w_prev||, or
  `absolute` ||w - w_prev||; a caller that froze rows passes their would-be change (`extra`),
  since their weights cannot show it;
- the threshold: an explicit one, or the drift below which `target_skip` of a sample of recent
  inputs would be skippable (an input is skippable when every lookup of it is a tracked row with
  a drift below the threshold, so the threshold is a quantile of the inputs' largest drift);
- rows below the threshold are stale until a later snapshot shows them moving again.

Which inputs are stale is the all-hot question of `hot_inputs.py` asked of the stale rows
instead of the device tier's (`all_hot_given_cold` with the non-stale lookups as the "cold" ones).
Lookups are table-major KJTs in feature order, as everywhere (`lookup_slots`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from embeddings.hot_inputs import AllHotClassifier, all_hot_given_cold
from embeddings.kjt_ops import in_feature_order

if TYPE_CHECKING:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from embeddings.plan import PlacementPlan

METRICS = ("relative", "absolute")
_TINY = 1e-12  # a row of zeros has no relative drift to speak of: measured against this norm


@dataclass
class Lookups:
    """A mini-batch's lookups, table-major: each one's tracked row (-1: untracked) and the
    number of lookups per bag (`lengths`, [tables * rows]); `rows` KJT rows, `rows_per_input` of
    them per input (TBSM: the history steps and the candidate)."""

    slots: torch.Tensor  # int64 [lookups]
    lengths: torch.Tensor  # int64 [tables * rows]
    rows: int
    rows_per_input: int = 1

    @property
    def inputs(self) -> int:
        return self.rows // self.rows_per_input

    def bag_of_lookup(self) -> torch.Tensor:
        """int64 [lookups]: the bag (table * rows + row) each lookup belongs to."""
        bags = torch.arange(self.lengths.numel())
        return bags.repeat_interleave(self.lengths, output_size=self.slots.numel())

    def per_input(self, per_bag: torch.Tensor, reduce: str) -> torch.Tensor:
        """A value per bag [tables * rows] reduced over each input's bags ("all" or "amax")."""
        x = per_bag.view(-1, self.rows).t().reshape(self.inputs, -1)  # [inputs, R * tables]
        return x.all(1) if reduce == "all" else x.amax(1)


class StalenessTracker:
    """Snapshots, drift and the stale set of a plan's hot rows (`tracked` in hot-table order)."""

    def __init__(
        self,
        plan: PlacementPlan,
        metric: str = "relative",
        threshold: float | None = None,
        target_skip: float | None = None,
    ) -> None:
        if metric not in METRICS:
            raise ValueError(
                f"staleness metric: expected one of {', '.join(METRICS)}, got {metric!r}"
            )
        if threshold is None and target_skip is None:
            raise ValueError("staleness: needs an explicit threshold or a target skip share")
        if threshold is not None and not (math.isfinite(threshold) and threshold >= 0):
            raise ValueError(f"staleness threshold: expected a number >= 0, got {threshold}")
        if target_skip is not None and not 0.0 <= target_skip < 1.0:
            raise ValueError(f"staleness target skip share: expected [0, 1), got {target_skip}")
        self.classifier = AllHotClassifier(plan)  # lookups -> tracked row (hot-table index)
        self.feature_names = list(plan.feature_names)
        self.tables, self.rows = plan.hot_ids()  # (table, row) of each tracked row
        self.metric = metric
        self.fixed_threshold = threshold
        self.target_skip = target_skip
        n = self.num_tracked
        self.stale = torch.zeros(n, dtype=torch.bool)
        self.drift = torch.zeros(n)  # at the last snapshot (0 before the second)
        self.threshold = float("nan")  # nan until a drift has been measured
        self.snapshots = 0
        self.weights: torch.Tensor | None = None  # [n, dim] at the last snapshot
        self.state: torch.Tensor | None = None  # their optimizer state then (None for SGD)

    @property
    def num_tracked(self) -> int:
        return int(self.tables.size)

    @property
    def stale_share(self) -> float:
        return float(self.stale.float().mean()) if self.num_tracked else 0.0

    # --- lookups ------------------------------------------------------------------------------

    def lookups(self, features: KeyedJaggedTensor, inputs: int) -> Lookups:
        """The tracked row of every lookup of `features` (CPU), with `inputs` inputs (labels)."""
        features = in_feature_order(features, self.feature_names)
        values, lengths = features.values().cpu(), features.lengths().cpu().long()
        rows = features.stride()
        if inputs < 1 or rows % inputs:
            raise ValueError(f"staleness: {rows} KJT rows do not split into {inputs} inputs")
        slots = self.classifier.slots(values, lengths, rows).long()
        return Lookups(slots, lengths, rows, rows // inputs)

    def stale_lookups(self, lk: Lookups) -> torch.Tensor:
        """bool [lookups]: the lookup's row is tracked and stale."""
        # one gather: slot -1 (untracked) reads the False appended at the end
        return torch.cat([self.stale, torch.zeros(1, dtype=torch.bool)])[lk.slots]

    def stale_inputs(self, lk: Lookups, stale_lookups: torch.Tensor | None = None) -> torch.Tensor:
        """bool [inputs]: every lookup of the input (every step of it, for TBSM) is a stale row.
        An input without lookups is never stale (nothing says it is)."""
        if stale_lookups is None:
            stale_lookups = self.stale_lookups(lk)
        fresh_at = torch.nonzero(~stale_lookups).squeeze(1)
        stale_rows = all_hot_given_cold(fresh_at, lk.lengths, lk.rows)  # [rows]
        has_lookups = lk.per_input(lk.lengths, "amax") > 0
        return stale_rows.view(lk.inputs, lk.rows_per_input).all(1) & has_lookups

    # --- snapshots ------------------------------------------------------------------------------

    def snapshot(
        self,
        weights: torch.Tensor,
        state: torch.Tensor | None,
        sample: Lookups | None,
        extra: torch.Tensor | None = None,
    ) -> dict:
        """Take the tracked rows' current `weights` (and optimizer `state`); from the second
        snapshot on, measure each row's drift since the one before (`extra`: a change the
        weights do not show, added to it), set the threshold (from `sample`, recent inputs,
        when it is not fixed) and the stale set. Returns what was measured."""
        weights = weights.detach().float()
        if weights.shape[0] != self.num_tracked:
            raise ValueError(f"staleness: {weights.shape[0]} rows for {self.num_tracked} tracked")
        if self.weights is not None:
            change = weights - self.weights.to(weights.device)
            if extra is not None:
                change = change + extra.to(weights.device)
            drift = torch.linalg.vector_norm(change, dim=1)
            if self.metric == "relative":
                base = torch.linalg.vector_norm(self.weights.to(weights.device), dim=1)
                drift = drift / base.clamp(min=_TINY)
            self.drift = drift.cpu()
            self.threshold = self._threshold(sample)
            self.stale = self.drift < self.threshold
        self.weights = weights.clone()
        self.state = None if state is None else state.detach().clone()
        self.snapshots += 1
        return {
            "snapshot": self.snapshots, "threshold": self.threshold,
            "stale_row_share": self.stale_share,
            "median_drift": float(self.drift.median()) if self.num_tracked else 0.0,
        }  # fmt: skip

    def _threshold(self, sample: Lookups | None) -> float:
        if self.fixed_threshold is not None:
            return float(self.fixed_threshold)
        if sample is None or not sample.inputs or not self.target_skip:
            return 0.0
        m = self.input_max_drift(sample)
        finite = torch.sort(m[torch.isfinite(m)])[0]
        if not finite.numel():
            return 0.0  # no input of the sample could ever be skipped
        k = min(math.ceil(self.target_skip * m.numel()), finite.numel())
        if k < 1:
            return 0.0
        # the smallest threshold under which the k inputs of least drift are skippable (drifts
        # are float32, and so is the threshold, or comparing would round it back down)
        return float(np.nextafter(finite[k - 1].numpy(), np.float32(np.inf)))

    def input_max_drift(self, lk: Lookups) -> torch.Tensor:
        """float [inputs]: the largest drift among an input's lookups (inf when one of them is
        not tracked, or when it has none): it is skippable under thresholds above this."""
        per_lookup = torch.full((lk.slots.numel(),), math.inf)
        tracked = lk.slots >= 0
        per_lookup[tracked] = self.drift[lk.slots[tracked]]
        per_bag = torch.full((lk.lengths.numel(),), -math.inf)
        per_bag.scatter_reduce_(0, lk.bag_of_lookup(), per_lookup, "amax")
        m = lk.per_input(per_bag, "amax")
        m[m == -math.inf] = math.inf  # no lookups at all
        return m

    def use_random_stale_set(self, generator: torch.Generator) -> None:
        """The random control: as many stale rows as now, chosen at random among the tracked."""
        k = int(self.stale.sum())
        self.stale = torch.zeros_like(self.stale)
        self.stale[torch.randperm(self.num_tracked, generator=generator)[:k]] = True

    # --- checkpoints ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        out = {
            "stale": self.stale.clone(),
            "drift": self.drift.clone(),
            "threshold": torch.tensor(self.threshold, dtype=torch.float64),
            "snapshots": torch.tensor(self.snapshots),
        }
        if self.weights is not None:
            out["weights"] = self.weights.cpu()
        if self.state is not None:
            out["state"] = self.state.cpu()
        return out

    def load_state_dict(self, state: dict[str, torch.Tensor], device: torch.device) -> None:
        n = self.num_tracked
        if tuple(state["stale"].shape) != (n,):
            raise ValueError(
                f"staleness: the checkpoint tracks {state['stale'].numel()} rows, this plan {n}"
            )
        self.stale = state["stale"].to(torch.bool).clone()
        self.drift = state["drift"].float().clone()
        self.threshold = float(state["threshold"])
        self.snapshots = int(state["snapshots"])
        self.weights = state["weights"].to(device) if "weights" in state else None
        self.state = state["state"].to(device) if "state" in state else None

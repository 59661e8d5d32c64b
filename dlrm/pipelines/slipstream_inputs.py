"""Slipstream's input stream: an epoch's source batches -> full mini-batches of the inputs kept.

`--slipstream-mode drop` leaves out inputs whose every lookup is a stale row, and refills each
mini-batch from the inputs after it, so steps stay full size and the epoch ends early. This is
that refilling, with the bookkeeping that keeps `--resume` exact:

- a `Cursor` (source batch, input in it) says how far the *trained* steps have consumed the
  epoch. After a mini-batch it points at the next kept input (the dropped inputs before it are
  consumed with the mini-batch), or at the end of the epoch when none is left, so the trainer's
  position (`batch_in_epoch`, whole source batches consumed) plus the cursor's input is where a
  resumed run continues, and the epoch ends with its last trained mini-batch;
- which inputs are kept is decided per source batch when the stream first opens it
  (`decide(batch_index, batch)`: the kept positions, or None for all), with the stale set of
  the moment. The set changes only at snapshots, and then the caller `restart`s the stream from
  the trained cursor: the mini-batches read ahead (a pipeline that stages ahead, Hotline's)
  are made again with the new set, exactly as a run resumed at that step makes them.

A mini-batch whose inputs are all kept is the source batch itself (nothing is copied), so with
nothing stale the stream gives the trainer exactly the batches it would have had.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from torchrec.datasets.utils import Batch

from embeddings.kjt_ops import gather_rows


@dataclass(frozen=True)
class Cursor:
    batch: int = 0  # source batches of the epoch wholly consumed
    position: int = 0  # inputs of source batch `batch` consumed


@dataclass
class Yielded:
    """One mini-batch the stream gave out, and what it accounts for."""

    cursor: Cursor  # where the stream stands once it is trained
    trained: int = 0  # its inputs
    dropped: int = 0  # inputs left out before the cursor (since the previous mini-batch)
    dropped_lookups: int = 0
    extra: object = None  # what `transform` attached (Slipstream's frozen lookups)
    batch: Batch | None = None  # the mini-batch (before `transform`)


@dataclass
class _Opened:
    batch: Batch
    kept: np.ndarray | None  # bool per input; None: all
    _lookups: np.ndarray | None = field(default=None)  # lookups per input, when known

    @property
    def size(self) -> int:
        return int(self.batch.labels.numel())

    @property
    def lookups(self) -> np.ndarray:
        if self._lookups is None:
            self._lookups = lookups_per_input(self.batch)
        return self._lookups

    def kept_from(self, p: int) -> np.ndarray:
        """Positions >= p that are kept."""
        if self.kept is None:
            return np.arange(p, self.size)
        return p + np.flatnonzero(self.kept[p:])


# which inputs of a source batch are kept (bool, None: all), optionally with each one's lookups
Decision = np.ndarray | None | tuple[np.ndarray, np.ndarray]


def lookups_per_input(batch: Batch) -> np.ndarray:
    """Lookups of each input, every feature (and every step of it, for TBSM)."""
    kjt = batch.sparse_features
    rows, inputs = kjt.stride(), max(1, batch.labels.numel())
    per_row = kjt.lengths().view(-1, rows).sum(0).long()
    return per_row.view(inputs, -1).sum(1).numpy()


class RefillingStream:
    """Mini-batches of `batch_size` kept inputs from source batches `0 .. limit - 1` of an epoch."""

    def __init__(
        self,
        batch_size: int,
        limit: int,
        decide: Callable[[int, Batch], Decision],
        transform: Callable[[Batch], tuple[Batch, object]] | None = None,
    ) -> None:
        self.batch_size = batch_size
        self.epoch_batches = self.limit = limit
        self.decide = decide
        self.transform = transform
        self.cursor = Cursor()  # what the trained steps consumed
        self.pending: deque[Yielded] = deque()  # given out, not yet trained, oldest first
        self._source: Iterator[Batch] | None = None
        self._raw: dict[int, Batch] = {}  # source batches from the cursor's on, as read
        self._next = 0  # index of the next source batch to read
        self._opened: dict[int, _Opened] = {}  # decisions of the current generator
        self.last_consumed: Batch | None = None  # the newest source batch wholly consumed

    # --- the epoch's source ---------------------------------------------------------------------

    def open(self, source: Iterator[Batch], cursor: Cursor) -> None:
        """A new epoch's source batches, from `cursor.batch` on (a resumed run's from its cursor)."""
        self._source, self.cursor = source, cursor
        self.limit = self.epoch_batches
        self._raw.clear()
        self._next = cursor.batch
        self.last_consumed = None

    def restart(self) -> Iterator[Batch]:
        """A new generator from the trained cursor; decisions are taken anew."""
        self.pending.clear()
        self._opened.clear()
        return self._generate()

    def source_batch(self, j: int) -> Batch | None:
        """Source batch j (j >= the cursor's), read when first needed; None past the epoch."""
        if j < self.cursor.batch:
            raise IndexError(f"source batch {j} is behind the stream's cursor {self.cursor}")
        while self._next <= j:
            if self._next >= self.limit:
                return None
            try:
                self._raw[self._next] = next(self._source)
            except StopIteration:
                self.limit = self._next
                return None
            self._next += 1
        return self._raw.get(j)

    def _open(self, j: int) -> _Opened | None:
        if j not in self._opened:
            raw = self.source_batch(j)
            if raw is None:
                return None
            kept = self.decide(j, raw)
            self._opened[j] = _Opened(raw, *kept) if isinstance(kept, tuple) else _Opened(raw, kept)
        return self._opened[j]

    # --- mini-batches ---------------------------------------------------------------------------

    def _skip(self, y: Yielded, o: _Opened, a: int, b: int) -> None:
        """Inputs a .. b-1 of `o` are consumed; count those left out."""
        if o.kept is None or b <= a:
            return
        out = ~o.kept[a:b]
        y.dropped += int(out.sum())
        y.dropped_lookups += int(o.lookups[a:b][out].sum())

    def _generate(self) -> Iterator[Batch]:
        j, p, B = self.cursor.batch, self.cursor.position, self.batch_size
        while True:
            y, parts, have = Yielded(self.cursor), [], 0
            while have < B:
                o = self._open(j)
                if o is None:
                    break
                avail = o.kept_from(p)
                take = avail[: B - have]
                if take.size:
                    self._skip(y, o, p, int(take[-1]) + 1)
                    parts.append((o, take))
                    have, p = have + take.size, int(take[-1]) + 1
                if take.size < avail.size:  # full inside this source batch
                    break
                self._skip(y, o, p, o.size)
                j, p = j + 1, 0
            # consume the dropped inputs up to the next kept one (or the epoch's end)
            while (o := self._open(j)) is not None:
                nxt = o.kept_from(p)
                if nxt.size:
                    self._skip(y, o, p, int(nxt[0]))
                    p = int(nxt[0])
                    break
                self._skip(y, o, p, o.size)
                j, p = j + 1, 0
            y.cursor, y.trained = Cursor(j, p), have
            if not have:  # nothing left to train in this epoch
                self.pending.append(y)
                return
            batch = y.batch = self._assemble(parts)
            if self.transform is not None:
                batch, y.extra = self.transform(batch)
            self.pending.append(y)
            yield batch

    def _assemble(self, parts: list[tuple[_Opened, np.ndarray]]) -> Batch:
        if len(parts) == 1 and parts[0][1].size == parts[0][0].size:
            return parts[0][0].batch  # every input of one source batch: the batch itself
        rows = []  # KJT (and dense) rows of the inputs: R per input for TBSM, sample-major
        for o, idx in parts:
            R = max(1, o.batch.sparse_features.stride() // max(1, o.size))
            rows.append(idx if R == 1 else (idx[:, None] * R + np.arange(R)).reshape(-1))
        return Batch(
            dense_features=torch.cat([o.batch.dense_features[torch.from_numpy(r)] for (o, _), r in zip(parts, rows)]),
            sparse_features=gather_rows([(o.batch.sparse_features, r) for (o, _), r in zip(parts, rows)]),
            labels=torch.cat([o.batch.labels[torch.from_numpy(i)] for o, i in parts]),
        )  # fmt: skip

    def trained(self) -> Yielded:
        """The oldest mini-batch given out was trained: the cursor moves past it."""
        y = self.pending.popleft()
        self._advance(y.cursor)
        return y

    def finish(self) -> Yielded | None:
        """The generator found nothing more to train: what it left out is consumed (None when
        it had not reached the end)."""
        if not self.pending or self.pending[-1].trained:
            return None
        y = self.pending.pop()
        self.pending.clear()
        self._advance(y.cursor)
        return y

    def _advance(self, cursor: Cursor) -> None:
        for j in [j for j in self._raw if j < cursor.batch]:
            self.last_consumed = self._raw.pop(j)
        self.cursor = cursor

    def sample(self, avoid: frozenset[int] = frozenset(), ahead: int = 8) -> Batch | None:
        """Recent inputs, as the source has them: the source batch at the cursor, or the first
        after it (up to `ahead`) whose index is not in `avoid`; at the epoch's end the last one
        consumed."""
        j = self.cursor.batch
        for k in range(j, min(j + ahead, self.limit)):
            if k not in avoid:
                j = k
                break
        raw = self.source_batch(j) if j < self.limit else None
        return raw if raw is not None else self.last_consumed


def random_kept(seed: int, epoch: int, index: int, inputs: int, share: float) -> np.ndarray:
    """bool [inputs]: kept with probability 1 - share, the same for a (seed, epoch, batch)
    whenever it is asked (the random control needs no state to be resumed)."""
    gen = torch.Generator().manual_seed((seed * 1_000_003 + epoch) * 1_000_003 + index)
    return (torch.rand(inputs, generator=gen) >= share).numpy()

"""`RowStore`: a tier's rows (weights and optimizer state) in and out by global row id.

It is what a faster tier stages from and writes back to: FAE's replica syncs (embeddings/memory_tiers.py),
and a staged collection's cold rows (embeddings/staged/collection.py), whose only home it is. Implemented by
the host tier (`HostTier`, embeddings/memory_tiers.py) and the SSD tier (`ScmStore`,
embeddings/ssd/store.py); a new store implements the abstract methods and overrides the defaults
it has a use for.

Rows are named by global row id (tables back to back in feature order). `read_rows(ids)` gives
(weights [n, dim] float32, optimizer state [n, dim] / [n], or None for SGD) as CPU tensors in the
order of `ids`; `write_rows` stores them back. Ids are int64 global ids the store holds (`holds`):
any other is a TierError, never a wrong row.

Beyond rows, a store owns its own concerns: the time the training step's thread spends in it
(`step_io`), files of its own that a checkpoint marks a consistent point of instead of copying
its rows (`begin_checkpoint` ... `end_checkpoint`, `checkpoint_state`), and its counters and
description for the run's metrics and summary.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager, nullcontext

import numpy as np
import torch

from embeddings.errors import PlacementError


class RowStore(ABC):
    name: str  # the tier's name in a plan ("host", "ssd"); names the link bytes are counted on
    backend: str  # how it stores rows, for people
    own_files: bool = False  # rows in files of its own: a checkpoint holds a point of them

    # --- rows -------------------------------------------------------------------------------------

    @abstractmethod
    def holds(self, ids: torch.Tensor) -> torch.Tensor:
        """bool per id: is this store the row's home?"""

    @abstractmethod
    def read_rows(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    @abstractmethod
    def write_rows(
        self, ids: torch.Tensor, weights: torch.Tensor, state: torch.Tensor | None
    ) -> None: ...

    def give_rows(
        self, ids: torch.Tensor, weights: torch.Tensor, state: torch.Tensor | None
    ) -> None:
        """`write_rows` of tensors the caller gives up (it never touches them again): a store
        may keep them without a copy and store them later, off the caller's thread, as long as
        every later read sees them (the SSD tier's write queue). By default: `write_rows`."""
        self.write_rows(ids, weights, state)

    def peek_rows(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`read_rows` for exports: no side effect on what the store keeps close (its caches)."""
        return self.read_rows(ids)

    @abstractmethod
    def init_rows(self, table: int, rows: torch.Tensor, out: torch.Tensor) -> None:
        """Write the initial weights of `table`'s rows `rows` (row ids in the table) into `out`
        ([n, dim], any device): the values this store's rows start from, so that a faster tier
        holding some rows starts them from the same."""

    def keep_only(self, remaps: list[np.ndarray]) -> RowStore:
        """A store of the same kind holding only the rows `remaps` gives it (per table a row's
        slot, -1 = not here), with their current values: the others moved to a faster tier."""
        raise PlacementError(f"{self.name} tier: its rows are fixed when it is made")

    def step_io(self) -> AbstractContextManager:
        """Around the store calls made on the training step's own thread (write-backs, renewals):
        a store whose calls may wait on a device accounts their time."""
        return nullcontext()

    # --- checkpoints ------------------------------------------------------------------------------

    def begin_checkpoint(self) -> bool:
        """Before a checkpoint's state is taken (every row written back): True when the store
        marked a consistent point of its own files, which the checkpoint then holds
        (`checkpoint_state`) instead of its rows."""
        return False

    def end_checkpoint(self, written: bool) -> None:
        """After the checkpoint begun was written (`written`), failed, or was given up."""
        return None

    checkpoint_keys: tuple[str, ...] = ()  # the names `checkpoint_state` returns

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        """The point `begin_checkpoint` marked, as tensors."""
        return {}

    def load_checkpoint_state(self, state: dict[str, torch.Tensor]) -> None:
        """Roll the store's files back to a checkpoint's point."""
        raise PlacementError(f"{self.name} tier: a checkpoint holds its rows, not a point of files")

    # --- what the run reports ---------------------------------------------------------------------

    def counters(self, collection: dict) -> dict:
        """The store's counters for the summary (`collection`: its collection's counters, for
        those that are per step)."""
        return {}

    def logged_counters(self) -> tuple[str, ...]:
        """Which of `counters` a metrics.jsonl train event carries."""
        return ()

    def placement_info(self, rows: int, row_bytes: int) -> dict:
        """The summary's description of the store holding `rows` rows of `row_bytes` bytes."""
        return {f"{self.name}_tier_bytes": rows * row_bytes}

    def summary_parts(self, counters: dict) -> dict[str, dict]:
        """The store's own part of summary.json (`counters`: this store's `counters`), where it
        is a capability of its own (the SSD tier's); none by default."""
        return {}

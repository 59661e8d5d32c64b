"""What staging one mini-batch makes (`StagedEmbeddingBagCollection.stage`, embeddings/staged/collection.py):
its cold rows read from the row store, and each lookup's row in the device tier."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class StagedRows:
    """One mini-batch's cold rows, read from the row store, and its lookups' rows in the device
    tier. `weight[i]` (and `state[i]`) is global row `gids[i]`; gids are sorted and unique, so
    the rows of table t are the `per_table[t]` after those of the tables before it."""

    gids: torch.Tensor  # int64, CPU
    weight: torch.Tensor  # [n, dim] float32, on the training device
    state: torch.Tensor | None  # the optimizer state of those rows (None for SGD)
    per_table: torch.Tensor  # int64 [tables], CPU
    lookups_per_table: torch.Tensor  # int64 [tables], CPU: the mini-batch's lookups
    indices: torch.Tensor  # each lookup's row in its device-tier table (hot slot or staging slot)
    lookups: int
    popular_inputs: int  # inputs whose every lookup is a hot row (nothing to stage)
    version: int  # write-backs the store had received when the read began
    seconds: float = 0.0  # the staging's own time
    ready: torch.cuda.Event | None = None  # CUDA: recorded on the side stream after the copies
    renewed: int = 0  # rows read again on the worker since (`renewal`), not counted yet
    # (the gids of the rows in the slots when the worker renewed it, which of these staged rows
    # are among them, and where): `using` copies them from the slots if those went home last
    overlap: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    @property
    def rows(self) -> int:
        return self.gids.numel()


def members(x: torch.Tensor, sorted_set: torch.Tensor) -> torch.Tensor:
    """bool per element of `x`: is it in `sorted_set` (sorted, unique)?"""
    if not sorted_set.numel():
        return torch.zeros(x.shape, dtype=torch.bool)
    at = torch.searchsorted(sorted_set, x).clamp(max=sorted_set.numel() - 1)
    return sorted_set[at] == x

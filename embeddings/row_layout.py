"""Global row ids and the flat view of tables laid back to back: what collections, tiers and row
stores share about where a table's rows sit (here, below all of them, so none imports another
to reach it).

Rows are named by *global row id*: tables back to back in feature order, global id = first
global row of the table + row.
"""

from __future__ import annotations

import numpy as np
import torch


def table_row_base(sizes: list[int]) -> torch.Tensor:
    """First global row id of each table (int64)."""
    base = torch.zeros(len(sizes), dtype=torch.int64)
    if len(sizes) > 1:
        base[1:] = torch.cumsum(torch.tensor(sizes[:-1], dtype=torch.int64), 0)
    return base


def flat_rows(views: list[torch.Tensor]) -> torch.Tensor | None:
    """One [sum rows, ...] view over per-table views laid back to back in one buffer, else None."""
    first = views[0]
    trail = tuple(first.shape[1:])
    row_elems = int(np.prod(trail)) if trail else 1
    expect = first.data_ptr()
    for v in views:
        if tuple(v.shape[1:]) != trail or not v.is_contiguous() or v.data_ptr() != expect:
            return None
        expect += v.shape[0] * row_elems * v.element_size()
    total = sum(v.shape[0] for v in views)
    return first.as_strided((total, *trail), first.stride(), first.storage_offset())

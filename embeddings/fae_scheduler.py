"""The FAE schedule: which inputs of a stretch of data form hot and cold mini-batches, in what order.

Pure index arithmetic on a hot/cold mask, so the same data always gives the same schedule (a
resumed run replays it exactly) and it can be tested without a model.

A *window* is a run of consecutive source mini-batches. Its inputs are split into
- cold mini-batches: every input with a cold lookup, topped up to a whole batch with the window's
  last hot inputs (so every batch but the window's last has exactly `batch_size` inputs);
- hot mini-batches: the remaining hot inputs.
Both keep the inputs' original order. A window of W full source batches gives exactly W batches,
so an epoch keeps its number of steps and batch k of an epoch always comes from window k // W.

Orders:
- `interleave` (default): windows of `switch_period` batches, each one's hot batches then its cold
  batches. The hot/cold ratio of every stretch of the epoch follows the data; the tiers are
  synchronised at most twice per window.
- `block`: the whole epoch is one window, all cold batches first, then all hot ones (the order of
  the original FAE code; kept as an ablation, it is known to cost accuracy).
"""

from __future__ import annotations

import math

import numpy as np

ORDERS = ("interleave", "block")


def window_bounds(num_batches: int, switch_period: int, order: str) -> list[tuple[int, int]]:
    """[start, end) source-batch ranges of the windows of an epoch."""
    if order not in ORDERS:
        raise ValueError(f"unknown FAE order {order!r}: expected one of {', '.join(ORDERS)}")
    if switch_period < 1:
        raise ValueError(f"--fae-switch-period: expected a positive integer, got {switch_period}")
    if order == "block":
        return [(0, num_batches)] if num_batches else []
    return [(s, min(s + switch_period, num_batches)) for s in range(0, num_batches, switch_period)]


def window_layout(
    hot: np.ndarray, batch_size: int, order: str = "interleave"
) -> list[tuple[str, np.ndarray]]:
    """Mini-batches of one window: [(kind, input positions)], kind 'hot' or 'cold', in run order."""
    hot = np.asarray(hot, dtype=bool)
    cold_idx = np.flatnonzero(~hot)
    hot_idx = np.flatnonzero(hot)
    k_cold = math.ceil(cold_idx.size / batch_size)
    fill = min(k_cold * batch_size - cold_idx.size, hot_idx.size)
    cold_members = np.sort(np.concatenate([cold_idx, hot_idx[hot_idx.size - fill :]]))
    hot_members = hot_idx[: hot_idx.size - fill]
    cold_batches = [
        ("cold", cold_members[i : i + batch_size]) for i in range(0, cold_members.size, batch_size)
    ]
    hot_batches = [
        ("hot", hot_members[i : i + batch_size]) for i in range(0, hot_members.size, batch_size)
    ]
    return cold_batches + hot_batches if order == "block" else hot_batches + cold_batches

"""A staged collection's full tables (embeddings/staged/collection.py), from its two tiers: the device tier's
hot rows (`SlotTier`) and the row store's others, a piece of rows at a time (whole, a table's
rows took as many bytes again beside their copy)."""

from __future__ import annotations

import torch

from embeddings.row_store import RowStore
from embeddings.staged.slot_tier import SlotTier

_CHUNK = 1 << 18  # rows per piece


def assemble(tier: SlotTier, store: RowStore, state: bool) -> list[torch.Tensor]:
    """Every table's weights (or optimizer state), as new CPU tensors."""
    out = []
    trail = tuple((tier.state if state else tier.weight).shape[1:])
    for t, n in enumerate(tier.sizes):
        base = int(tier.row_base[t])
        full = torch.empty((n, *trail), dtype=torch.float32)
        hot, cold = tier.hot_and_cold(t)
        for a in range(0, cold.numel(), _CHUNK):
            rows = cold[a : a + _CHUNK]
            full[rows] = store.peek_rows(rows + base)[1 if state else 0]
        if hot.numel():
            full[hot] = tier.hot_rows(t, state).cpu()
        out.append(full)
    return out


@torch.no_grad()
def store_tables(
    tier: SlotTier,
    store: RowStore,
    weights: list[torch.Tensor] | None,
    states: list[torch.Tensor] | None,
) -> None:
    """Full tables' weights and/or states back into both tiers (what is None is kept)."""
    has_state = tier.state is not None
    for t in range(len(tier.sizes)):
        base = int(tier.row_base[t])
        hot, cold = tier.hot_and_cold(t)
        if hot.numel():
            if weights is not None:
                tier.hot_rows(t, False).copy_(weights[t][hot])
            if states is not None:
                tier.hot_rows(t, True).copy_(states[t][hot])
        for a in range(0, cold.numel(), _CHUNK):
            rows = cold[a : a + _CHUNK]
            w = s = None
            if weights is None or (has_state and states is None):
                w, s = store.peek_rows(rows + base)
            if weights is not None:
                w = weights[t][rows]
            if has_state and states is not None:
                s = states[t][rows]
            store.write_rows(rows + base, w, s)


@torch.no_grad()
def rows_of(
    tier: SlotTier, store: RowStore, tables: torch.Tensor, rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rows (`tables[i]`, `rows[i]`): hot ones from the device tier, the others from the store."""
    tables = torch.as_tensor(tables).long()
    gids = torch.as_tensor(rows).long() + tier.row_base[tables]
    slots = tier.hot_map.slots(gids)
    hot = slots >= 0
    flat = (tier.table_start[tables[hot]] + slots[hot]).to(tier.device)
    weights = torch.empty(gids.numel(), tier.dim)
    state = None if tier.state is None else torch.empty((gids.numel(), *tier.state.shape[1:]))
    weights[hot] = tier.weight[flat].cpu()
    if state is not None:
        state[hot] = tier.state[flat].cpu()
    if not bool(hot.all()):
        w, s = store.read_rows(gids[~hot])
        weights[~hot] = w
        if state is not None:
            state[~hot] = s
    return weights, state

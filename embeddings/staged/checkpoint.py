"""A staged collection's checkpoint (embeddings/staged/collection.py) when its row store keeps its rows in
files of its own (the SSD tier): the device tier's hot rows and the point of the store's files its
`begin_checkpoint` marked, not the store's rows. The keys are `<prefix>tiered.<name>`, as in the
checkpoints written so far; loading them rolls the store's files back to that point."""

from __future__ import annotations

import torch

from embeddings.row_store import RowStore
from embeddings.staged.slot_tier import SlotTier

_HOT = ("hot_gids", "hot_weight", "hot_state")
_PREFIX = "tiered."


def _keys(store: RowStore, prefix: str) -> dict[str, str]:
    return {k: f"{prefix}{_PREFIX}{k}" for k in (*_HOT, *store.checkpoint_keys)}


def holds_point(store: RowStore, state_dict, prefix: str) -> bool:
    """Is `state_dict` this form (rather than full tables: a model file, another placement)?"""
    return store.own_files and f"{prefix}{_PREFIX}hot_gids" in state_dict


def save_point(tier: SlotTier, store: RowStore, destination, prefix: str) -> None:
    slots = tier.hot_slots(tier.hot_gids)
    values = {
        "hot_gids": tier.hot_gids.clone(),
        "hot_weight": tier.weight[slots].cpu(),
        "hot_state": tier.state[slots].cpu() if tier.state is not None else torch.zeros(0),
        **store.checkpoint_state(),
    }
    for k, v in values.items():
        destination[f"{prefix}{_PREFIX}{k}"] = v


def read_point(
    tier: SlotTier, store: RowStore, state_dict, prefix: str, missing_keys, unexpected_keys,
    error_msgs,
) -> dict[str, torch.Tensor] | None:  # fmt: skip
    """The checkpoint's values, or None when they cannot be loaded (the reason recorded in
    `missing_keys` / `error_msgs`, as `nn.Module.load_state_dict` reports it)."""
    mine = _keys(store, prefix)
    missing = [key for key in mine.values() if key not in state_dict]
    if missing:
        missing_keys.extend(missing)
        return None
    unexpected_keys.extend(k for k in state_dict if k.startswith(prefix) and k not in mine.values())
    values = {k: state_dict[key] for k, key in mine.items()}
    if not torch.equal(values["hot_gids"], tier.hot_gids):
        error_msgs.append(f"{mine['hot_gids']}: the checkpoint has another placement plan")
        return None
    return values


@torch.no_grad()
def restore_point(tier: SlotTier, store: RowStore, values: dict[str, torch.Tensor]) -> None:
    """The hot rows into the device tier, the store's files back to the checkpoint's point."""
    slots = tier.hot_slots(tier.hot_gids)
    tier.weight[slots] = values["hot_weight"].to(tier.device)
    if tier.state is not None:
        tier.state[slots] = values["hot_state"].reshape(tier.state[slots].shape).to(tier.device)
    store.load_checkpoint_state({k: values[k] for k in store.checkpoint_keys})

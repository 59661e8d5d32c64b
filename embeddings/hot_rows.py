"""Placement: from an access profile to a plan of which rows each tier holds.

    plan = plan_placement(profile, dims=[16] * 26, optimizer=SparseOptimizer("rowwise_adagrad"),
                          device_budget=parse_bytes("256MB"))
    plan.save("plan.npz")            # plan.npz (remap arrays) + plan.json (what a person reads)
    plan.remaps[t][row]              # the row's slot in the device tier, or -1 (cold)
    plan.tier("host")                # the generic view: any tier's rows and budget

The plan itself (tiers, files, validation) is `embeddings/plan.py`, re-exported here.
Rules (each one a bug of the original FAE code we do not copy):
- a row never seen in the sample is never hot, whatever the budget;
- a hot row costs its weights AND its optimizer state (`SparseOptimizer.state_floats`,
  embeddings/optimizer.py);
- rows compete across tables by lookups per byte, ties broken by (table, row): the same profile
  always gives the same plan.
Within one table, hot rows keep their id order in the hot table (offset of the table + rank).
"""

from __future__ import annotations

import re

import numpy as np
import torch

from embeddings.config import SparseOptimizer
from embeddings.errors import PlacementError
from embeddings.hot_inputs import AllHotClassifier
from embeddings.hot_map import use_dense
from embeddings.plan import (
    ALL,
    EXPLICIT,
    FORMAT,
    REST,
    TIER_ORDER,
    VERSION,
    PlacementPlan,
    TierPlan,
    remap_dtype,
    row_bytes,
)
from embeddings.profile import AccessProfile

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(text: str | int, flag: str = "--hot-budget") -> int:
    """'256MB', '1.5G', '64KiB', '1048576' -> bytes (binary units: 1 MB = 2**20 bytes)."""
    if isinstance(text, int):
        value = text
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgtKMGT]?)(?:i?[bB])?\s*", str(text))
        if not m:
            raise PlacementError(
                f"{flag}: expected a size like 256MB, 1.5GB or 1048576, got {text!r}"
            )
        value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value < 0:
        raise PlacementError(f"{flag}: expected a size >= 0, got {text!r}")
    return value


def plan_placement(
    profile: AccessProfile,
    dims: list[int],
    optimizer: SparseOptimizer,
    device_budget: int,
    host_budget: int | None = None,
    one_home: bool = False,
    sparse: bool | None = None,
    report: bool = True,
) -> PlacementPlan:
    """The hot rows that fit `device_budget` bytes (weights + optimizer state), hottest per byte
    first, on the device; the host holds every row (FAE's replica), or with `one_home` the rest.
    `sparse`: the device tier in the plan's sparse form (sorted hot rows per table); None
    decides as the device tier's own map does (`hot_map.use_dense`). `report`: False leaves
    `plan.report` empty (its shares of hot lookups and all-hot inputs are a pass over every
    kept input, 90% of a plan's time: the planner, which makes one per candidate budget and
    reads none of them, asks for none)."""
    T = profile.num_tables
    if len(dims) != T:
        raise PlacementError(f"{len(dims)} embedding widths for {T} tables")
    bpr = np.array([row_bytes(d, optimizer) for d in dims], dtype=np.int64)
    host_need = int(sum(n * b for n, b in zip(profile.table_sizes, bpr)))
    if not one_home and host_budget is not None and host_need > host_budget:
        raise PlacementError(
            f"the host tier needs {host_need} bytes for every row, over its budget of {host_budget}"
        )
    # candidates: rows seen at least once (never-seen rows are never hot)
    tables, rows, counts = [], [], []
    for t, c in enumerate(profile.counts):
        ids = np.flatnonzero(c > 0)
        tables.append(np.full(ids.size, t, dtype=np.int64))
        rows.append(ids.astype(np.int64))
        counts.append(c[ids])
    table = np.concatenate(tables)
    row = np.concatenate(rows)
    count = np.concatenate(counts)
    if np.unique(bpr).size == 1:
        score = count.astype(np.float64)  # integral: exact order
    else:
        score = count / bpr[table]
    order = np.lexsort((row, table, -score))  # last key first: score desc, then table, then row
    cum = np.cumsum(bpr[table[order]])
    take = order[: int(np.searchsorted(cum, device_budget, side="right"))]
    chosen_t, chosen_r = table[take], row[take]
    del table, row, count, score, order, cum
    hot_rows = np.bincount(chosen_t, minlength=T)
    if sparse is None:
        sparse = not use_dense(sum(profile.table_sizes), int(hot_rows.sum()))
    # the slots: the tier's tables back to back, a table's hot rows in id order
    held = [np.sort(chosen_r[chosen_t == t]) for t in range(T)]
    remaps = None
    if not sparse:
        dtype = remap_dtype(int(hot_rows.sum()))
        remaps, offset = [], 0
        for mine, n in zip(held, profile.table_sizes):
            r = np.full(n, -1, dtype=dtype)
            r[mine] = np.arange(offset, offset + mine.size, dtype=dtype)
            offset += mine.size
            remaps.append(r)
        held = None
    else:
        dtype = np.int32 if max(profile.table_sizes, default=0) < 2**31 else np.int64
        held = [h.astype(dtype) for h in held]
    plan = PlacementPlan.device_and_host(
        profile.feature_names, profile.table_sizes, dims, optimizer.kind, remaps,
        int(device_budget), host_budget, one_home=one_home, held=held,
    )  # fmt: skip
    if one_home and host_budget is not None and plan.host_bytes() > host_budget:
        raise PlacementError(
            f"the host tier needs {plan.host_bytes()} bytes for the rows not on the device, "
            f"over its budget of {host_budget}"
        )
    if report:
        plan.report = placement_report(plan, profile)
    return plan


def placement_report(plan: PlacementPlan, profile: AccessProfile) -> dict:
    """Hot rows per table and, measured on the profile's sample, the share of lookups that are hot
    and the share of inputs whose lookups are all hot (in-sample: optimistic for unseen data)."""
    per_table = []
    hot_lookups = total_lookups = 0
    device = plan.tier("device")
    for t, c in enumerate(profile.counts):
        ids = device.held_ids(t)
        h = int(c[ids].sum())
        n = int(c.sum())
        hot_lookups += h
        total_lookups += n
        per_table.append({
            "feature": plan.feature_names[t], "rows": plan.table_sizes[t], "hot_rows": int(ids.size),
            "hot_lookup_share": h / n if n else None,
        })  # fmt: skip
    inputs = profile.kept_inputs
    hot_inputs = 0
    if inputs:
        hot = AllHotClassifier(plan).mask(
            torch.from_numpy(profile.sample_values),
            torch.from_numpy(profile.sample_lengths.reshape(-1)),
            inputs,
        )
        hot_inputs = int(hot.sum())
    return {
        "hot_rows": plan.num_hot,
        "device_bytes": plan.device_bytes(),
        "hot_lookup_share": hot_lookups / total_lookups if total_lookups else None,
        "hot_input_share": hot_inputs / inputs if inputs else None,
        "inputs_measured": int(inputs),
        "tables": per_table,
    }


def fits_on_device(
    table_sizes: list[int], dims: list[int], optimizer: SparseOptimizer, budget: int
) -> bool:
    return sum(n * row_bytes(d, optimizer) for n, d in zip(table_sizes, dims)) <= budget


__all__ = [
    "ALL", "EXPLICIT", "FORMAT", "REST", "TIER_ORDER", "VERSION", "PlacementError", "PlacementPlan",
    "TierPlan", "fits_on_device", "parse_bytes", "placement_report", "plan_placement",
    "remap_dtype", "row_bytes",
]  # fmt: skip

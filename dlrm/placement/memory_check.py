"""Before any table is made: what the run needs per tier against what this process may use.

    check_memory(cfg, data, device)   # compose's pre-flight; a ConfigError of one line if short

A run that does not fit ends here, in one line naming both figures and the settings that would
fit, instead of in an allocator's traceback minutes later (the Terabyte tables, 62 GiB of fp32
rows, on a smaller machine). What this process may use is embeddings/room.py's inventory
(`--memory-limit` / `--device-memory-limit` plan for a smaller machine). What the run needs:
- the placement's rows and optimizer state per tier, and its own structures (the placement's
  side says: `placement_needs`, dlrm/placement/build_collection.py, and dlrm/placement/tiered_setup.py for the SSD tier);
- the dense part: its parameters (counted on the model built around no tables), their
  gradients and the dense optimizer's state, 4 bytes each;
- activations at the batch size: every linear layer's output width, the pooled embeddings and
  the dot interaction's matrix, per row of a measured batch (TBSM's are B*(T+1)), held
  ACTIVATION_COPIES times in training (output, what the activation keeps, the gradient); the
  evaluation batch's once, whichever is larger;
- the data loader: LOADER_BATCHES training batches in flight, measured on the first one;
- with `--resume`, the checkpoint read while the tables are made: as much again as the rows in
  memory.
On the CPU the device tier is host DRAM, so its needs are host needs. Multi-process runs keep
their own rules (tables sharded by torchrec): not checked here.
"""

from __future__ import annotations

import dataclasses
import logging
import math

import torch

from dlrm.config import TrainConfig
from dlrm.data import DataSplits
from dlrm.errors import ConfigError
from dlrm.placement.build_collection import resolve_placement
from dlrm.placement.kinds import AUTO
from dlrm.placement.needs import (  # noqa: F401  (dense_needs, run_tables: this module's face too)
    ACTIVATION_COPIES,
    LOADER_BATCHES,
    TIER_NAMES,
    changed,
    dense_needs,
    run_tables,
    with_placement,
)
from embeddings.room import TIERS, MemoryInventory, Needs, fmt_bytes, inventory

log = logging.getLogger(__name__)


def check_memory(cfg: TrainConfig, data: DataSplits, device: torch.device, world_size: int = 1):
    """ConfigError (one line) when the run's needs exceed what this process may use on a tier;
    returns the needs and the inventory otherwise."""
    if world_size > 1:
        return None
    tables = run_tables(cfg, data)
    base = dense_needs(cfg, data)
    needs = with_placement(base, cfg, tables)
    room = inventory(device, cfg.placing.memory_bytes(), cfg.placing.device_memory_bytes(),
                     needs.disk_dir if needs.on("disk") else None)  # fmt: skip
    on_cpu = room.device is None
    short = _short(needs, room, on_cpu)
    if not short:
        shown = needs.device_on_host() if on_cpu else needs
        log.info(
            "memory: needs %s",
            ", ".join(f"{fmt_bytes(shown.on(t))} of {TIER_NAMES[t]} (of {fmt_bytes(room.on(t).bytes)})"
                      for t in TIERS if shown.on(t) and room.on(t) is not None),
        )  # fmt: skip
        return needs, room
    placement = cfg.placing.placement
    if placement == AUTO:
        placement += f" ({resolve_placement(cfg.placing, tables, cfg.training.sparse_optimizer())})"
    fixes = _fixes(cfg, data, tables, base, room, on_cpu)
    if fixes is None and _short(base, room, on_cpu):  # no tables at all would fit either
        fixes = _batch_alone(cfg, base, room, on_cpu)
    if fixes is None:  # what to get more of: the tier that is short
        more = (
            "more free space under --scm-dir"
            if set(short) == {"disk"}
            else "a machine with more memory"
        )
        fixes = f"no placement fits: use {more}"
    elif set(short) == {"disk"}:  # the tier the user chose may be kept: give it the room it needs
        fixes += ", or use more free space under --scm-dir"
    raise ConfigError(f"--placement {placement}: {'; '.join(short.values())}; {fixes}")


def check_batch(cfg: TrainConfig, base: Needs, room: MemoryInventory) -> None:
    """ConfigError (one line) when the batch alone (`dense_needs`: the dense part, activations,
    the loader) does not fit, whatever the placement: the planner asks before it reads batches
    of that size for its profile."""
    short = _short(base, room, room.device is None)
    if short:
        placement = cfg.placing.placement
        raise ConfigError(
            f"--placement {placement}: {'; '.join(short.values())}; "
            f"{_batch_alone(cfg, base, room, room.device is None)}"
        )


def _batch_alone(cfg: TrainConfig, base: Needs, room: MemoryInventory, on_cpu: bool) -> str:
    """The way out when not even the batch fits: a smaller batch, unless the dense part (which
    no batch size changes) does not fit either: then more memory (a --memory-limit below what
    this process holds already, say)."""
    dense = Needs([i for i in base.items if i.what == "dense part"])
    if _short(dense, room, on_cpu):
        return "no placement fits: use a machine with more memory (or a larger --memory-limit)"
    big_test = cfg.eval_batch_size > cfg.training.mini_batch_size
    flag = "--test-mini-batch-size" if big_test else "--mini-batch-size"
    return f"no placement fits: the batch alone does not; use a smaller {flag}"


def _short(needs: Needs, room: MemoryInventory, on_cpu: bool) -> dict[str, str]:
    """tier -> 'needs X of TIER (items) but this process may use Y (source)', per tier that is
    short."""
    if on_cpu:
        needs = needs.device_on_host()
    out = {}
    for tier in TIERS:
        have, need = room.on(tier), needs.on(tier)
        if have is None or need <= have.bytes:
            continue
        items = needs.of(tier)
        shown = ", ".join(f"{i.what} {fmt_bytes(i.bytes)}" for i in items[:4])
        more = f", +{len(items) - 4} more" if len(items) > 4 else ""
        where = f" under {needs.disk_dir}" if tier == "disk" else ""
        out[tier] = (
            f"needs {fmt_bytes(need)} of {TIER_NAMES[tier]}{where} ({shown}{more}) but this "
            f"process may use {fmt_bytes(have.bytes)} ({have.source})"
        )
    return out


# --- the settings that would fit ----------------------------------------------------------------


def _fixes(cfg, data, tables, base: Needs, room: MemoryInventory, on_cpu: bool) -> str | None:
    fits = [_spell(w, cfg) for w in _suggested(cfg, tables, base, room)]
    m = _max_ind_range(cfg, tables, base, room, on_cpu)
    if m is not None:
        fits.append(f"a smaller --max-ind-range ({m} or less)")
    return "settings that fit: " + ", or ".join(fits) if fits else None


def _suggested(cfg, tables, base: Needs, room: MemoryInventory) -> list:
    """Per kind, the first of the planner's candidates (dlrm/placement/enumerator.py, the same
    enumerator; with no profile yet each kind's largest hot budget that fits) that fits with the
    planner's margin: the run's own kind first (only what changes is spelled), then the others
    in the registry's order."""
    from dlrm.placement.enumerator import PLAN_MARGIN, CandidateSpace, Enumerator
    from dlrm.placement.tiered_setup import scm_directory
    from embeddings.room import disk_room

    if room.disk is None:  # a kind with an SSD tier is judged against the disk under --scm-dir
        room = MemoryInventory(
            room.device, room.host, disk_room(scm_directory(cfg.scm, cfg.run_dir))
        )
    space = CandidateSpace(cfg, tables, base, room, PLAN_MARGIN)
    space.rows_cap = None  # a --hot-budget given is what the suggestion replaces
    first: dict[str, object] = {}
    for cand in Enumerator()(space):
        if cand.placement not in first and space.weigh(cand).fits:
            first[cand.placement] = cand
    own = cfg.placing.placement  # as it is, it does not fit: its own candidate differs
    ordered = ([first.pop(own)] if own in first else []) + list(first.values())
    return [space.weigh(c) for c in ordered]


def _fits(cfg, tables, base: Needs, room: MemoryInventory, on_cpu: bool) -> bool:
    needs = with_placement(base, cfg, tables)
    if needs.on("disk") and room.disk is None:
        from embeddings.room import disk_room

        room = MemoryInventory(room.device, room.host, disk_room(needs.disk_dir))
    return not _short(needs, room, on_cpu)


def _spell(w, cfg: TrainConfig) -> str:
    """A candidate as the flags that change the run into it: of its own kind, only the sizes
    that change; another kind's in full, with where its files go when it has a disk tier."""
    from embeddings.room import flag_bytes

    c = w.candidate
    own = c.placement == cfg.placing.placement
    now = {"hot_budget": cfg.placing.hot_budget.bytes, "scm_cache": cfg.scm.cache.bytes}
    over = {k: v for k, v in c.settings().items()
            if not own or (k != "placement" and flag_bytes(v) != flag_bytes(now[k]))}  # fmt: skip
    flags = " ".join(
        f"--{k.replace('_', '-')} {v if k == 'placement' else flag_bytes(v)}"
        for k, v in over.items()
    )
    if not own and w.needs.on("disk") and not cfg.scm.directory:  # on a disk the user picks
        flags += f" --scm-dir DIR (an SSD with {fmt_bytes(w.needs.on('disk'))} free)"
    return flags


def _max_ind_range(cfg, tables, base: Needs, room: MemoryInventory, on_cpu: bool) -> int | None:
    """The largest `--max-ind-range` (rounded down to two significant digits) whose tables fit
    with the placement as it is; None where the tables are not hashed from raw Criteo data."""
    if cfg.data.data_set not in ("kaggle", "terabyte") or not cfg.data.raw_data_file:
        return None

    def fits(m: int) -> bool:
        small = [dataclasses.replace(t, num_embeddings=min(t.num_embeddings, m)) for t in tables]
        return _fits(cfg, small, base, room, on_cpu)

    lo, hi = 0, max(t.num_embeddings for t in tables)
    while lo < hi:  # the largest m in [0, hi] that fits (m = 0: no table at all, always fits)
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    if lo < 1:
        return None
    digits = 10 ** max(0, int(math.log10(lo)) - 1)
    return lo // digits * digits

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
from torch import nn

from dlrm.build import build_model, table_sizes
from dlrm.config import TrainConfig
from dlrm.data import DataSplits, bag_sizes
from dlrm.errors import ConfigError
from dlrm.models.kinds import model_kind
from dlrm.placement.build_collection import placement_needs, resolve_placement
from embeddings import TableSpec, tables_for_features
from embeddings.hot_rows import row_bytes
from embeddings.room import TIERS, MemoryInventory, Needs, flag_bytes, fmt_bytes, inventory

log = logging.getLogger(__name__)

ACTIVATION_COPIES = 3
LOADER_BATCHES = 10  # the source builds up to 8 ahead (data_pipeline), the step and its pipeline
TIER_NAMES = {"device": "CUDA memory", "host": "host DRAM", "disk": "disk"}


def dense_needs(cfg: TrainConfig, data: DataSplits) -> Needs:
    """The dense part, its activations at the batch size and the data loader (module docstring)."""
    # the MLPs, no tables, on the meta device: counted without allocating (a DCN of rank 1e8
    # would otherwise take its terabytes before this check could refuse it)
    with torch.device("meta"):
        model = build_model(cfg, data, torch.device("meta"), nn.Module())
    params = sum(p.numel() for p in model.dense_parameters())
    widths = sum(m.out_features for m in model.modules() if isinstance(m, nn.Linear))
    del model
    n = len(data.table_sizes)
    per_row = widths + n * cfg.arch.sparse_feature_size + (n + 1) ** 2
    opt = cfg.training.sparse_optimizer()
    needs = Needs()
    needs.add("device", "dense part", 4 * params * (2 + opt.dense_state_floats()))
    if len(data.train):
        rows, size = _batch_shape(cfg, data)
        test = cfg.eval_batch_size / cfg.training.mini_batch_size
        acts = 4 * per_row * rows * max(ACTIVATION_COPIES, test)
        of = cfg.eval_batch_size if test > ACTIVATION_COPIES else cfg.training.mini_batch_size
        needs.add("device", f"activations at batch {of}", int(acts))  # the batch that sets them
        needs.add("host", "data loader", int(size * (LOADER_BATCHES + 2 * test)))
    return needs


def _batch_shape(cfg: TrainConfig, data: DataSplits) -> tuple[int, int]:
    """(rows, bytes) of one training batch. Counted, not made, for the data sets a config
    builds: a batch of `--mini-batch-size 1e9` or bags of `--multi-hot-sizes 1e6` took minutes
    or terabytes to make before this check could refuse it (issue 46). Any other source (a
    user's own batches, a benchmark's) has its own shapes: its first batch is measured."""
    if not type(data.train).__module__.startswith("data_pipeline."):
        batch = data.train.batch(0, 0)
        return batch.dense_features.shape[0], _batch_bytes(batch)
    n = len(data.table_sizes)
    rows = cfg.training.mini_batch_size * model_kind(cfg.arch.model).rows_per_sample(cfg)
    ids = sum(bag_sizes(cfg.data, n) or [1] * n)
    # dense float32, labels float32, KJT values int64 and lengths int32
    return rows, rows * (4 * data.num_dense + 8 * ids + 4 * n) + 4 * cfg.training.mini_batch_size


def _batch_bytes(batch) -> int:
    kjt = batch.sparse_features
    tensors = (batch.dense_features, batch.labels, kjt.values(), kjt.lengths())
    return sum(t.numel() * t.element_size() for t in tensors)


def run_tables(cfg: TrainConfig, data: DataSplits) -> list[TableSpec]:
    sizes = table_sizes(cfg, data)
    return tables_for_features(sizes, cfg.arch.sparse_feature_size, data.feature_names)


def check_memory(cfg: TrainConfig, data: DataSplits, device: torch.device, world_size: int = 1):
    """ConfigError (one line) when the run's needs exceed what this process may use on a tier;
    returns the needs and the inventory otherwise."""
    if world_size > 1:
        return None
    tables = run_tables(cfg, data)
    base = dense_needs(cfg, data)
    needs = _with_placement(base, cfg, tables)
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
    if placement == "auto":
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


def _with_placement(base: Needs, cfg: TrainConfig, tables: list[TableSpec]) -> Needs:
    needs = Needs(list(base.items), base.disk_dir).extend(placement_needs(cfg, tables))
    if cfg.run.resume:
        needs.add("host", "checkpoint read (--resume)", needs.rows_in_memory())
    return needs


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
    fits = []
    for tries in _candidates(cfg, tables, base, room, on_cpu):
        for over in tries:  # the first of each kind that fits
            changed = _changed(cfg, over)
            if changed is not None and _fits(changed, tables, base, room, on_cpu):
                fits.append(_spell(over, changed, base, tables))
                break
    m = _max_ind_range(cfg, tables, base, room, on_cpu)
    if m is not None:
        fits.append(f"a smaller --max-ind-range ({m} or less)")
    return "settings that fit: " + ", or ".join(fits) if fits else None


SHRINK = (1.0, 0.7, 0.5, 0.35, 0.25, 0.15)  # budgets tried, as shares of the first guess
SMALLEST = 64 * 2**10  # a budget below this is no suggestion


def _candidates(cfg, tables, base: Needs, room: MemoryInventory, on_cpu: bool) -> list[list[dict]]:
    """Overrides worth trying, each kind from its largest budgets down: where only CUDA memory is
    short, the host placement, or a --hot-budget of 80% of the device room left; the SSD tier
    (first guess: 40% of the host room left for hot rows and 30% for the row cache and its
    bookkeeping on the CPU, half of each room on CUDA; the cache no larger than the tables)."""
    out = []
    if not on_cpu and room.device is not None:
        hot = (room.device.bytes - base.on("device")) * 4 // 5
        if cfg.placing.placement == "device":
            out.append([dict(placement="host")])
        if cfg.placing.placement in ("fae", "hotline", "tiered"):
            out.append([dict(hot_budget=flag_bytes(int(hot * s))) for s in SHRINK
                        if hot * s >= SMALLEST])  # fmt: skip
    if len({t.embedding_dim for t in tables}) == 1:
        out.append(_tiered(cfg, tables, base, room, on_cpu))
    return out


def _tiered(cfg, tables, base: Needs, room: MemoryInventory, on_cpu: bool) -> list[dict]:
    probe = _changed(cfg, dict(placement="tiered", hot_budget=0, scm_cache=0))
    if probe is None or room.host is None or (not on_cpu and room.device is None):
        return []
    fixed = _with_placement(base, probe, tables)
    fixed = fixed.device_on_host() if on_cpu else fixed
    host = room.host.bytes - fixed.on("host")
    if on_cpu:
        hot, cache = host * 2 // 5, host * 3 // 10
    else:
        hot, cache = (room.device.bytes - fixed.on("device")) // 2, host // 2
    opt = probe.training.sparse_optimizer()
    rows = sum(t.num_embeddings * row_bytes(t.embedding_dim, opt) for t in tables)
    hot, cache = min(hot, rows), min(cache, rows)  # --scm-cache is capped at the rows anyway
    return [dict(placement="tiered", hot_budget=flag_bytes(int(hot * s)),
                 scm_cache=flag_bytes(int(cache * s)))
            for s in SHRINK if min(hot, cache) * s >= SMALLEST]  # fmt: skip


def _changed(cfg: TrainConfig, over: dict) -> TrainConfig | None:
    """`cfg` with `over`, or None when the combination is refused by the settings' rules."""
    try:
        return cfg.replace(**over)
    except ConfigError:
        return None


def _fits(cfg, tables, base: Needs, room: MemoryInventory, on_cpu: bool) -> bool:
    needs = _with_placement(base, cfg, tables)
    if needs.on("disk") and room.disk is None:
        from embeddings.room import disk_room

        room = MemoryInventory(room.device, room.host, disk_room(needs.disk_dir))
    return not _short(needs, room, on_cpu)


def _spell(over: dict, cfg: TrainConfig, base: Needs, tables) -> str:
    flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in over.items())
    if over.get("placement") == "tiered":
        disk = placement_needs(cfg, tables).on("disk")
        flags += f" --scm-dir DIR (an SSD with {fmt_bytes(disk)} free)"
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

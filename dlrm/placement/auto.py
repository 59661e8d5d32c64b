"""`--placement auto`: where every row lives, chosen by predicted step time and memory.

    decision = plan(cfg, data, device)        # the candidates weighed, one chosen
    print(decision.table())                    # candidate, ms/step, memory per tier, why

1. The inventory (embeddings/room.py): what this process may use on the device (CUDA), in
   host DRAM and on the disk under `--scm-dir`. The dense part, its optimizer, the activations
   at the batch size and the loader come off it as dlrm/placement/memory_check.py counts them.
2. `device` first: when every table fits there, it is chosen with no further cost (no profile,
   no prediction): nothing is faster than every row in the fastest memory.
3. Otherwise one planning sample is read (dlrm/placement/candidates.py's PlanningSample: the access profile,
   made or reused as a run makes it, and the sparse features of SAMPLE_BATCHES evenly spread
   training batches the profile did not count), and the candidates are listed: `host`; `fae`,
   `hotline` and `tiered` at the hot budgets where the profile's cumulative lookup share reaches
   HOT_SHARES (and the largest budget that fits, where a share's does not); `tiered` with DRAM
   row caches of CACHE_SHARES of the host room its hot rows leave.
4. Each candidate's needs per tier are dlrm/placement/memory_check.py's (the same bounds the pre-flight check
   uses). It fits when every memory tier's needs are at most (1 - PLAN_MARGIN) of the room:
   the needs are bounds from budgets, and an allocator, a fragmented heap or a neighbour's growth
   take more than they say. The disk's need is exact and an upper bound (the tier's file is
   sparse until its blocks are written), so it gets no margin. A `--hot-budget` the user gave
   bounds the rows on the device too (`rows_cap`: auto's rule before the planner).
5. The registered predictor (perfmodel's, dlrm/placement/candidates.py) predicts each fitting candidate's
   step time; the fastest is chosen (ties: the kind first in PREFERENCE, then the least device
   and host memory).
   Without a predictor the first fitting candidate in PREFERENCE order (a kind's largest budgets
   first) is chosen, and the table says so.
   Where nothing fits: one line naming the closest candidate and the tier it is short on.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dlrm.config import TrainConfig
from dlrm.data import DataSplits, steps_per_epoch
from dlrm.errors import ConfigError
from dlrm.placement import decision_file
from dlrm.placement.candidates import (
    STREAM_BATCHES,
    Candidate,
    PlanningSample,
    Prediction,
    predictor,
)
from dlrm.placement.decision_file import DECISION_NAME  # noqa: F401  (its name here too)
from dlrm.placement.memory_check import (
    TIER_NAMES,
    _changed,
    _with_placement,
    dense_needs,
    run_tables,
)
from dlrm.placement.run_plan import obtain_profile, profile_training_sample, profiled_batches
from dlrm.placement.tiered_setup import scm_directory
from embeddings import SparseOptimizer, TableSpec
from embeddings.errors import PlacementError, ProfileError
from embeddings.hot_rows import row_bytes
from embeddings.profile import AccessProfile
from embeddings.room import MemoryInventory, Needs, fmt_bytes, inventory
from embeddings.ssd.cache import RowCache, SlotMap

log = logging.getLogger(__name__)

PLAN_MARGIN = 0.3  # share of each memory tier's room a chosen placement leaves free (as the
# settings the memory check suggests do, dlrm/placement/memory_check.py): the needs are bounds from budgets, and on
# a shared machine the neighbours grow too
HOT_SHARES = (0.5, 0.8, 0.9, 0.95, 0.99)  # cumulative lookup shares the hot budgets cover
CACHE_SHARES = (0.25, 0.5, 1.0)  # of the host room a tiered candidate's hot rows leave
SAMPLE_BATCHES = 8  # training batches whose sparse features a predictor replays
PREFERENCE = ("device", "fae", "hotline", "tiered", "host")
GRAIN = 2**10  # budgets and caches are whole KiB
SMALLEST = 64 * GRAIN  # no row cache below this is a candidate
MEMORY_TIERS = ("device", "host")


@dataclass
class Weighed:
    """One candidate: its needs per tier (bytes; on the CPU the device's are host DRAM), its
    prediction, and why it was not chosen (None: it fits, or it was chosen)."""

    candidate: Candidate
    needs: dict[str, int]
    prediction: Prediction | None = None
    rejected: str | None = None
    cfg: TrainConfig | None = field(default=None, repr=False, compare=False)
    short: int = field(default=0, repr=False, compare=False)  # bytes missing, all tiers

    @property
    def fits(self) -> bool:
        return self.cfg is not None and not self.rejected

    def to_json(self) -> dict:
        c, p = self.candidate, self.prediction
        return {
            "label": c.label(), "placement": c.placement, "hot_budget": c.hot_budget,
            "scm_cache": c.scm_cache, "needs": dict(self.needs),
            "ms_per_step": p.ms_per_step if p else None, "parts": p.parts if p else None,
            "detail": p.detail if p else None, "rejected": self.rejected,
        }  # fmt: skip

    @classmethod
    def from_json(cls, d: dict) -> Weighed:
        c = Candidate(d["placement"], int(d.get("hot_budget") or 0), int(d.get("scm_cache") or 0))
        p = None
        if d.get("ms_per_step") is not None:
            p = Prediction(float(d["ms_per_step"]), d.get("parts") or {}, d.get("detail") or {})
        needs = {k: int(v) for k, v in (d.get("needs") or {}).items()}
        return cls(c, needs, p, d.get("rejected"))


@dataclass
class Decision:
    """The candidates weighed, the one chosen and how (`how`), the room per tier, the margin."""

    chosen: Candidate
    how: str
    weighed: list[Weighed]
    room: dict[str, dict]
    margin: float = PLAN_MARGIN
    planning_s: float = 0.0
    # the JSON the run directory's decision file holds: what its checkpoints record
    record: dict | None = field(default=None, repr=False, compare=False)

    def chosen_row(self) -> Weighed | None:
        return next((w for w in self.weighed if w.candidate == self.chosen), None)

    def predicted_ms(self) -> float | None:
        row = self.chosen_row()
        return row.prediction.ms_per_step if row and row.prediction else None

    def checked_ms(self) -> float | None:
        """The prediction for the steps the placement check measures (dlrm/placement/auto_check.py):
        the run's mean unless the predictor said otherwise (`detail["checked_ms"]`)."""
        row = self.chosen_row()
        if row and row.prediction and "checked_ms" in row.prediction.detail:
            return float(row.prediction.detail["checked_ms"])
        return self.predicted_ms()

    def to_json(self) -> dict:
        return {
            "chosen": self.chosen.label(), "settings": self.chosen.settings(), "how": self.how,
            "margin": self.margin, "planning_s": round(self.planning_s, 3), "room": self.room,
            "candidates": [w.to_json() for w in self.weighed],
        }  # fmt: skip

    @classmethod
    def from_json(cls, d: dict, source: str = "placement decision") -> Decision:
        try:
            s = d["settings"]
            chosen = Candidate(s["placement"], int(s.get("hot_budget") or 0),
                               int(s.get("scm_cache") or 0))  # fmt: skip
            rows = [Weighed.from_json(w) for w in d.get("candidates", [])]
            return cls(chosen, str(d["how"]), rows, dict(d.get("room") or {}),
                       float(d.get("margin", PLAN_MARGIN)), float(d.get("planning_s", 0.0)))  # fmt: skip
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"{source}: not a placement decision ({e})") from None

    def table(self) -> str:
        """The printed table: one row per candidate, the chosen one marked."""
        tiers = [t for t in ("device", "host", "disk") if t in self.room]
        head = ["candidate", "ms/step", *tiers, ""]
        rows = []
        for w in self.weighed:
            p = w.prediction
            ms = f"{p.ms_per_step:.2f}" if p else "-"
            mem = [fmt_bytes(w.needs[t]) if w.needs.get(t) else "-" for t in tiers]
            why = "CHOSEN" if w.candidate == self.chosen else (w.rejected or "")
            rows.append([w.candidate.label(), ms, *mem, why])
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head) - 1)]
        fmt = lambda r: "  ".join(c.ljust(n) for c, n in zip(r, widths)) + "  " + r[-1]  # noqa: E731
        room = ", ".join(
            f"{t} {fmt_bytes(r['bytes'])} ({r['source']})" for t, r in self.room.items()
        )
        lines = [f"--placement auto: {self.chosen.label()} ({self.how}; planning "
                 f"{self.planning_s:.1f} s)", f"  room: {room}; margin {self.margin:.0%} of memory",
                 "  " + fmt(head)]  # fmt: skip
        lines += ["  " + fmt(r) for r in rows]
        sources = sorted({str(w.prediction.detail.get("source")) for w in self.weighed
                          if w.prediction and w.prediction.detail.get("source")})  # fmt: skip
        if sources:
            lines.append(f"  predicted by: {'; '.join(sources)}")
        if any(src.startswith("roofline") for src in sources):
            # without a fitted model the step's kernels are guessed from peak figures: say how
            # to get real ones, since the ranking of close candidates rests on them
            lines.append("  (a fitted model predicts this machine's steps: python -m perfmodel "
                         "microbench --out DIR, then python -m perfmodel fit --bench DIR)")  # fmt: skip
        return "\n".join(line.rstrip() for line in lines)


# --- the candidates -------------------------------------------------------------------------------


def hot_budgets(profile: AccessProfile, tables: list[TableSpec], opt: SparseOptimizer) -> list[int]:
    """The device bytes (weights + optimizer state) of the hottest rows, ranked by lookups per
    byte as the plan ranks them, where their share of the profiled lookups reaches each of
    HOT_SHARES; rounded up to KiB."""
    rb = np.array([row_bytes(t.embedding_dim, opt) for t in tables], dtype=np.int64)
    counts = [np.asarray(c)[np.asarray(c) > 0] for c in profile.counts]
    if not any(c.size for c in counts):
        return []
    if np.unique(rb).size == 1:  # one width: the count alone ranks the rows
        per_row = np.sort(np.concatenate(counts))[::-1].astype(np.int64)
        cum_bytes = np.arange(1, per_row.size + 1, dtype=np.int64) * int(rb[0])
    else:
        value = np.concatenate(counts).astype(np.int64)
        size = np.concatenate([np.full(c.size, b) for c, b in zip(counts, rb)])
        order = np.argsort(-(value / size), kind="stable")
        per_row, cum_bytes = value[order], np.cumsum(size[order])
    cum = np.cumsum(per_row)
    out = []
    for share in HOT_SHARES:
        k = min(int(np.searchsorted(cum, share * cum[-1])), cum.size - 1)
        out.append(-(-int(cum_bytes[k]) // GRAIN) * GRAIN)
    return sorted(set(out))


class _Scale:
    """What every candidate is weighed against: the tables, the dense part's needs, the room."""

    def __init__(self, cfg, tables, base: Needs, room: MemoryInventory, margin: float) -> None:
        self.cfg, self.tables, self.base, self.room, self.margin = cfg, tables, base, room, margin
        self.on_cpu = room.device is None
        opt = cfg.training.sparse_optimizer()
        self.row_bytes = row_bytes(tables[0].embedding_dim, opt)
        self.total = sum(t.num_embeddings * row_bytes(t.embedding_dim, opt) for t in tables)
        self.rows_cap = rows_cap(cfg)

    def rows_on_device(self, cand: Candidate) -> int:
        """The embedding rows (weights + optimizer state) `cand` keeps on the device."""
        if cand.placement == "device":
            return self.total
        return 0 if cand.placement == "host" else min(cand.hot_budget, self.total)

    def usable(self, tier: str) -> int | None:
        r = self.room.on(tier)
        if r is None:
            return None
        return int(r.bytes * (1 - self.margin)) if tier in MEMORY_TIERS else r.bytes

    def weigh(self, cand: Candidate) -> Weighed:
        over = cand.settings()
        if cand.placement == "tiered" and not self.cfg.scm.directory:
            over["scm_dir"] = scm_directory(self.cfg.scm, self.cfg.run_dir)
        cfg = _changed(self.cfg, over)
        if cfg is None:
            return Weighed(cand, {}, rejected="refused by the settings' rules")
        needs = _with_placement(self.base, cfg, self.tables)
        needs = needs.device_on_host() if self.on_cpu else needs
        per_tier = {t: needs.on(t) for t in ("device", "host", "disk") if needs.on(t)}
        short, missing = [], 0
        rows = self.rows_on_device(cand)
        if self.rows_cap is not None and rows > self.rows_cap:
            short.append(f"--hot-budget short by {fmt_bytes(rows - self.rows_cap)}")
            missing += rows - self.rows_cap
        for tier, need in per_tier.items():
            have = self.usable(tier)
            if have is not None and need > have:
                short.append(f"{TIER_NAMES[tier]} short by {fmt_bytes(need - have)}")
                missing += need - have
        return Weighed(cand, per_tier, rejected="; ".join(short) or None, cfg=cfg, short=missing)

    def largest_fitting(self, kind: str, cache: int = 0) -> int:
        """The largest hot budget (KiB steps) with which `kind` fits; 0 when none does."""
        lo, hi = 0, -(-self.total // GRAIN)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.weigh(Candidate(kind, mid * GRAIN, cache)).fits:
                lo = mid
            else:
                hi = mid - 1
        return lo * GRAIN

    def caches(self, hot: int) -> list[int]:
        """Row caches for the tiered placement with `hot` bytes of hot rows: CACHE_SHARES of the
        host room left (the cache's bookkeeping counted), no larger than the tier's rows."""
        probe = self.weigh(Candidate("tiered", hot, SMALLEST))
        usable = self.usable("host")
        if probe.cfg is None or usable is None:
            return [SMALLEST]
        left = usable - probe.needs.get("host", 0)
        per_slot = RowCache.BOOKKEEPING_PER_SLOT + SlotMap.BYTES_PER_ENTRY / SlotMap.LOAD
        scale = 1 + per_slot / self.row_bytes
        tier_rows = max(0, self.total - hot)
        out = {min(int(left * s / scale) // GRAIN * GRAIN, tier_rows) for s in CACHE_SHARES}
        out = sorted(c for c in out if c >= SMALLEST)
        return out or [SMALLEST]  # none fits: listed, and rejected with its reason


def rows_cap(cfg: TrainConfig) -> int | None:
    """A `--hot-budget` the user gave (whatever its value, the default's too): the device bytes
    auto may give embedding rows (every table for `device`, the hot rows otherwise), as it was
    before the planner; None: the device's room alone bounds them."""
    return cfg.placing.hot_budget.bytes if "hot_budget" in cfg.given else None


def candidates(scale: _Scale, budgets: list[int]) -> list[Candidate]:
    """host, then fae, hotline and tiered over the hot budgets (the largest that fits added where
    a share's budget does not), tiered over its row caches."""
    out = [Candidate("host")]
    single_width = len({t.embedding_dim for t in scale.tables}) == 1
    for kind in ("fae", "hotline", "tiered"):
        if kind == "tiered" and not single_width:
            continue  # the SSD tier stores rows of one width
        mine = [b for b in budgets if scale.rows_cap is None or b <= scale.rows_cap]
        cap = scale.largest_fitting(kind, SMALLEST if kind == "tiered" else 0)
        if scale.rows_cap is not None:
            cap = min(cap, scale.rows_cap // GRAIN * GRAIN)
        if cap >= GRAIN and (not mine or cap < max(mine)):
            mine.append(cap)
        for hot in sorted(set(mine), reverse=True):
            if kind == "tiered":
                out += [Candidate(kind, hot, c) for c in reversed(scale.caches(hot))]
            else:
                out.append(Candidate(kind, hot))
    return out


# --- the sample and the decision ------------------------------------------------------------------


def sample_batches(n: int, counted: list[int] = ()) -> list[int]:
    """SAMPLE_BATCHES batch indices evenly spread over the n-batch epoch's batches the profile
    did not count (`counted`): a batch the profile counted has no cold row the profile did not
    see, so replaying it would make the cold rows and the cache's misses look fewer. All of
    them when the profile counted every batch (nothing else to take)."""
    free = np.ones(n, dtype=bool)
    free[np.asarray(list(counted), dtype=np.int64)] = False
    pool = np.flatnonzero(free) if free.any() else np.arange(n)
    k = min(pool.size, SAMPLE_BATCHES)
    return [int(pool[(j * pool.size) // k]) for j in range(k)]


def counted_batches(n: int, rate: float) -> list[int]:
    """The batches of an n-batch epoch a profile of `rate` counted (`profile_training_sample`'s;
    a profile records its rate as counted/n, which `round` gives back exactly)."""
    return profiled_batches(n, min(n, max(1, round(rate * n))) / n) if rate > 0 else []


def read_sample(
    cfg: TrainConfig, data: DataSplits, tables: list[TableSpec], room, write: bool = True
) -> PlanningSample:
    """The access profile (made or reused as a run makes it; written to the run directory, or
    to `--profile-file`, only with `write`) and SAMPLE_BATCHES batches' sparse features, out of
    the batches the profile counted."""
    names = [t.feature_name for t in tables]
    sizes = [t.num_embeddings for t in tables]
    try:
        if write or (cfg.placing.profile_file and Path(cfg.placing.profile_file).is_file()):
            profile = obtain_profile(cfg.placing, cfg.run_dir, names, sizes, data.train)
        else:
            profile = profile_training_sample(
                data.train, names, sizes, cfg.placing.profile_sample_rate
            )
    except (ProfileError, PlacementError) as e:
        raise ConfigError(str(e)) from None
    n = len(data.train)
    counted = counted_batches(n, profile.sample_rate or cfg.placing.profile_sample_rate)
    idx = sample_batches(n, counted)
    batches = [data.train.batch(0, j).sparse_features for j in idx]
    run = steps_per_epoch(cfg, data) * cfg.training.nepochs

    @functools.cache
    def stream() -> list:  # the run's first uncounted batches, read once, only when asked
        skip = set(counted)
        first = [j for j in range(n) if j not in skip] or list(range(n))
        return [data.train.batch(0, j).sparse_features for j in first[:STREAM_BATCHES]]

    return PlanningSample(tables, profile, batches, idx, n, room, (0, run), stream)


def _preference(w: Weighed) -> tuple:
    c = w.candidate
    return (PREFERENCE.index(c.placement), -c.hot_budget, -c.scm_cache)


def plan(
    cfg: TrainConfig, data: DataSplits, device, write: bool = True, margin: float = PLAN_MARGIN
) -> Decision:
    """The decision for `cfg` (module docstring); ConfigError (one line) where nothing fits.
    `write`: the access profile may be written (the run directory's, or `--profile-file`)."""
    t0 = time.perf_counter()
    tables = run_tables(cfg, data)
    base = dense_needs(cfg, data)
    room = inventory(device, cfg.placing.memory_bytes(), cfg.placing.device_memory_bytes(),
                     scm_directory(cfg.scm, cfg.run_dir))  # fmt: skip
    scale = _Scale(cfg, tables, base, room, margin)
    shown_room = {t: {"bytes": r.bytes, "source": r.source}
                  for t in ("device", "host", "disk") if (r := room.on(t)) is not None}  # fmt: skip
    first = scale.weigh(Candidate("device"))
    if first.fits:
        how = "every table fits on the device: nothing to plan"
        return Decision(first.candidate, how, [first], shown_room, margin, time.perf_counter() - t0)
    sample = read_sample(cfg, data, tables, room, write)
    opt = cfg.training.sparse_optimizer()
    weighed = [first] + [
        scale.weigh(c) for c in candidates(scale, hot_budgets(sample.profile, tables, opt))
    ]
    fitting = [w for w in weighed if w.fits]
    if not fitting:
        raise ConfigError(_nothing_fits(weighed, margin))
    fn = predictor()
    if fn is None:
        chosen = min(fitting, key=_preference)
        how = "no performance model: chosen by preference (" + ", ".join(PREFERENCE) + ")"
        for w in fitting:
            if w is not chosen:
                w.rejected = "fits; later in the preference order"
    else:
        # a minute or more on a first plan (calibration, step captures): said as it goes
        print(f"--placement auto: predicting the step time of {len(fitting)} placements that "
              "fit", file=sys.stderr, flush=True)  # fmt: skip
        for i, w in enumerate(fitting, 1):
            print(f"  {i}/{len(fitting)} {w.candidate.label()} ({time.perf_counter() - t0:.0f} s "
                  "so far)", file=sys.stderr, flush=True)  # fmt: skip
            try:
                w.prediction = fn(w.cfg, w.candidate, sample)
            except Exception as e:  # a predictor's failure costs its candidate, not the run
                log.warning("placement %s: no prediction (%s)", w.candidate.label(), e)
                w.rejected = f"no prediction ({type(e).__name__}: {e})"
        predicted = [w for w in fitting if w.prediction is not None]
        if predicted:
            # equal predictions: the kind preferred, then of its candidates the one that needs
            # the least memory (a cache the run never fills reads as much as a larger one)
            chosen = min(predicted, key=lambda w: (
                round(w.prediction.ms_per_step, 3), PREFERENCE.index(w.candidate.placement),
                sum(w.needs.get(t, 0) for t in MEMORY_TIERS), _preference(w)))  # fmt: skip
            best = chosen.prediction.ms_per_step
            how = f"the fastest predicted of those that fit with a {margin:.0%} margin on memory"
            for w in predicted:
                if w is not chosen:
                    w.rejected = f"slower (+{w.prediction.ms_per_step - best:.2f} ms/step)"
        else:  # the model could predict none of them: the order of preference decides
            chosen = min(fitting, key=_preference)
            chosen.rejected = None
            how = "no prediction: chosen by preference (" + ", ".join(PREFERENCE) + ")"
    del sample
    return Decision(chosen.candidate, how, weighed, shown_room, margin, time.perf_counter() - t0)


def _nothing_fits(weighed: list[Weighed], margin: float) -> str:
    closest = min((w for w in weighed if w.cfg is not None), key=lambda w: w.short,
                  default=weighed[0])  # fmt: skip
    return (
        f"--placement auto: no placement fits this process's memory with a {margin:.0%} margin "
        f"(closest: {closest.candidate.label()}, {closest.rejected}); use a machine with more "
        "memory, more free space under --scm-dir, or a larger --memory-limit"
    )


# --- a run's decision -----------------------------------------------------------------------------


def resolve_auto(
    cfg: TrainConfig,
    data: DataSplits,
    device,
    world_size: int = 1,
    rank: int = 0,
    checkpoint: decision_file.Checkpoint | None = None,
) -> tuple[TrainConfig, Decision | None]:
    """`cfg` with the placement `--placement auto` chose applied, and the decision (None: not
    auto, or several processes). The decision is printed and written to the run directory; a
    resumed run reuses its own, checked against `checkpoint`'s record of it
    (dlrm/placement/decision_file.py), never planning anew."""
    if cfg.placing.placement != "auto":
        return cfg, None
    if world_size > 1:
        if rank == 0:
            print(
                f"--placement auto with {world_size} processes: no planning; the multi-process rule "
                "applies (every table sharded across the processes by torchrec's planner, "
                "--sharding, as --placement device)",
                flush=True,
            )
        return cfg, None
    resumed = decision_file.resumed(cfg, checkpoint)  # checked against the checkpoint's
    if resumed is not None:
        decision = Decision.from_json(resumed[0], str(cfg.run_dir / DECISION_NAME))
        decision.how, decision.record = resumed[1], resumed[0]
    else:
        rule = decision_file.rule_before_the_planner(cfg, data)
        if rule is not None:
            decision = Decision(rule, decision_file.RULE_BEFORE_THE_PLANNER, [], {})
        else:
            decision = plan(cfg, data, device)
        decision.record = decision.to_json()
        decision_file.write(cfg.run_dir / DECISION_NAME, decision.record)
    print(decision.table(), flush=True)
    return applied(cfg, decision), decision


def applied(cfg: TrainConfig, decision: Decision) -> TrainConfig:
    """`cfg` with the chosen candidate's settings; a tiered choice's `--scm-dir` defaults to
    OUT_DIR/scm; the profile the planner wrote is the one the placement plan is made from."""
    from dlrm.placement.run_plan import PROFILE_NAME

    over = decision.chosen.settings()
    kind = decision.chosen.placement
    if kind == "tiered" and not cfg.scm.directory:
        over["scm_dir"] = scm_directory(cfg.scm, cfg.run_dir)
    made = cfg.run_dir / PROFILE_NAME
    if kind in ("fae", "hotline", "tiered") and not cfg.placing.profile_file and made.is_file():
        over["profile_file"] = str(made)
    out = _changed(cfg, over)
    if out is None:
        raise ConfigError(f"--placement auto: {decision.chosen.label()} is refused by the settings")
    return out

"""The planner's candidates: what every candidate is weighed against (`CandidateSpace`: the
tables, the dense part's needs, the room per tier and its margin), the hot budgets a profile
suggests, and the default enumerator, which asks every registered placement kind for its
candidates (dlrm/placement/kinds.py). The pre-flight memory check's suggestions come from the
same enumerator and margin (dlrm/placement/memory_check.py).

`Coverage`: what a hot set of a given size covers of the profiled lookups, and so the embedding
bytes a candidate moves between host and device per sample (a kind's `bytes_per_sample`): the
planner drops a hot set too small to move fewer bytes than the placement without one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dlrm.config import TrainConfig
from dlrm.placement.candidates import MEMORY_TIERS, Candidate, Prediction, StepTime, TierBytes
from dlrm.placement.kinds import all_kinds
from dlrm.placement.needs import TIER_NAMES, changed, with_placement
from embeddings import SparseOptimizer, TableSpec
from embeddings.hot_rows import row_bytes
from embeddings.profile import AccessProfile
from embeddings.room import MemoryInventory, Needs, fmt_bytes
from embeddings.ssd.cache import RowCache, SlotMap

PLAN_MARGIN = 0.3  # share of each memory tier's room a chosen placement (and a setting the memory
# check suggests) leaves free: the needs are bounds from budgets, and on a shared machine the
# neighbours grow too
HOT_SHARES = (0.5, 0.8, 0.9, 0.95, 0.99)  # cumulative lookup shares the hot budgets cover
CACHE_SHARES = (0.25, 0.5, 1.0)  # of the host room a tiered candidate's hot rows leave
GRAIN = 2**10  # budgets and caches are whole KiB
SMALLEST = 64 * GRAIN  # no row cache below this is a candidate


def _ranked(profile: AccessProfile, tables: list[TableSpec], opt: SparseOptimizer):
    """Every row seen, hottest per byte first as the plan ranks them: (table, row, count,
    cumulative bytes)."""
    rb = np.array([row_bytes(t.embedding_dim, opt) for t in tables], dtype=np.int64)
    parts = [(t, np.flatnonzero(np.asarray(c) > 0)) for t, c in enumerate(profile.counts)]
    table = np.concatenate([np.full(ids.size, t, dtype=np.int64) for t, ids in parts])
    row = np.concatenate([ids.astype(np.int64) for _, ids in parts])
    count = np.concatenate([np.asarray(profile.counts[t])[ids] for t, ids in parts]).astype(
        np.int64
    )
    size = rb[table]
    order = np.argsort(-(count / np.maximum(size, 1)), kind="stable")
    return table[order], row[order], count[order], np.cumsum(size[order])


def hot_budgets(profile: AccessProfile, tables: list[TableSpec], opt: SparseOptimizer) -> list[int]:
    """The device bytes (weights + optimizer state) of the hottest rows, ranked by lookups per
    byte as the plan ranks them, where their share of the profiled lookups reaches each of
    HOT_SHARES; rounded up to KiB."""
    _, _, count, cum_bytes = _ranked(profile, tables, opt)
    if not count.size:
        return []
    cum = np.cumsum(count)
    out = []
    for share in HOT_SHARES:
        k = min(int(np.searchsorted(cum, share * cum[-1])), cum.size - 1)
        out.append(-(-int(cum_bytes[k]) // GRAIN) * GRAIN)
    return sorted(set(out))


class Coverage:
    """What the hot set of a budget covers of a profile's lookups, and the embedding bytes that
    cross between host and device per sample because of what it leaves out."""

    def __init__(self, profile: AccessProfile, tables: list[TableSpec], opt: SparseOptimizer):
        self.profile, self.tables = profile, tables
        self.table, self.row, self.count, self.cum_bytes = _ranked(profile, tables, opt)
        inputs = max(1, int(profile.inputs))
        # per table, read once: a sum over every row's count (Terabyte: 200M+), per candidate
        self.total = np.array(profile.lookups(), dtype=np.float64)
        self.lookups = self.total / inputs  # per sample
        self.row_bytes = np.array(
            [row_bytes(t.embedding_dim, opt) for t in tables], dtype=np.float64
        )
        # the placement without a hot set: each pooled embedding to the device, its gradient back
        self.plain = float(sum(2 * 4 * t.embedding_dim for t in tables))

    def _hot(self, budget: int) -> int:
        return int(np.searchsorted(self.cum_bytes, budget, side="right"))

    def shares(self, budget: int) -> np.ndarray:
        """Per table, the share of its profiled lookups the hot set of `budget` bytes covers."""
        k = self._hot(budget)
        hot = np.bincount(self.table[:k], weights=self.count[:k], minlength=len(self.tables))
        return hot / np.maximum(self.total, 1.0)

    def all_hot(self, budget: int) -> float:
        """The share of inputs whose every lookup is hot: counted on the inputs the profile kept,
        else the product of the tables' shares (lookups taken as independent)."""
        p = self.profile
        if not p.kept_inputs:
            return float(np.prod(self.shares(budget)))
        k = self._hot(budget)
        n = p.kept_inputs
        cold = np.zeros(n, dtype=bool)
        lengths = np.asarray(p.sample_lengths, dtype=np.int64)
        values = np.asarray(p.sample_values)
        start = 0
        for t in range(p.num_tables):
            seg = values[start : start + int(lengths[t].sum())]
            start += seg.size
            hot_rows = np.sort(self.row[:k][self.table[:k] == t])
            miss = ~np.isin(seg, hot_rows, assume_unique=False)
            owner = np.repeat(np.arange(n), lengths[t])
            cold |= np.bincount(owner, weights=miss, minlength=n) > 0
        return float(1.0 - cold.mean())

    def replicated(self, budget: int) -> float:
        """Bytes per sample of a placement that trains all-hot inputs on the device and the rest
        from the host (FAE): the plain placement's bytes for every input not all hot."""
        return (1.0 - self.all_hot(budget)) * self.plain

    def staged(self, budget: int) -> float:
        """Bytes per sample of a placement that stages each cold lookup's row with its optimizer
        state to the device and writes it back (Hotline, tiered)."""
        cold = self.lookups * (1.0 - self.shares(budget))
        return float(2 * np.sum(cold * self.row_bytes))


@dataclass
class Weighed:
    """One candidate: its needs per tier (on the CPU the device's are host DRAM), its embedding
    bytes moved per sample (None: not known), its prediction, and why it is no contender (None:
    it fits, or it was chosen)."""

    candidate: Candidate
    needs: TierBytes
    prediction: Prediction | None = None
    rejected: str | None = None
    cfg: TrainConfig | None = field(default=None, repr=False, compare=False)
    short: int = field(default=0, repr=False, compare=False)  # bytes missing, all tiers
    moved: float | None = field(default=None, compare=False)

    @property
    def fits(self) -> bool:
        return self.cfg is not None and not self.rejected

    def to_json(self) -> dict:
        c, p = self.candidate, self.prediction
        out = {
            "label": c.label(), "placement": c.placement, "hot_budget": c.hot_budget,
            "scm_cache": c.scm_cache, "needs": self.needs.to_json(),
            "ms_per_step": p.ms_per_step if p else None, "parts": p.parts.to_json() if p else None,
            "detail": p.detail if p else None, "rejected": self.rejected,
        }  # fmt: skip
        if self.moved is not None:
            out["bytes_per_sample"] = round(self.moved, 1)
        return out

    @classmethod
    def from_json(cls, d: dict) -> Weighed:
        c = Candidate(d["placement"], int(d.get("hot_budget") or 0), int(d.get("scm_cache") or 0))
        p = None
        if d.get("ms_per_step") is not None:
            p = Prediction(float(d["ms_per_step"]), StepTime.from_json(d.get("parts")),
                           d.get("detail") or {})  # fmt: skip
        moved = d.get("bytes_per_sample")
        return cls(c, TierBytes.from_json(d.get("needs")), p, d.get("rejected"),
                   moved=None if moved is None else float(moved))  # fmt: skip


class CandidateSpace:
    """What every candidate is weighed against: the tables, the dense part's needs, the room,
    the margin; and the hot budgets the profile suggests (`budgets`, empty before a profile)."""

    SMALLEST = SMALLEST

    def __init__(self, cfg: TrainConfig, tables, base: Needs, room: MemoryInventory, margin: float,
                 budgets: list[int] = ()) -> None:  # fmt: skip
        self.cfg, self.tables, self.base, self.room, self.margin = cfg, tables, base, room, margin
        self.budgets = list(budgets)
        self.on_cpu = room.device is None
        opt = cfg.training.sparse_optimizer()
        self.row_bytes = row_bytes(tables[0].embedding_dim, opt)
        self.total = sum(t.num_embeddings * row_bytes(t.embedding_dim, opt) for t in tables)
        self.rows_cap = rows_cap(cfg)

    def usable(self, tier: str) -> int | None:
        r = self.room.on(tier)
        if r is None:
            return None
        return int(r.bytes * (1 - self.margin)) if tier in MEMORY_TIERS else r.bytes

    def weigh(self, cand: Candidate) -> Weighed:
        over = {**cand.settings(), **cand.kind.settings(cand, self.cfg)}
        cfg = changed(self.cfg, over)
        if cfg is None:
            return Weighed(cand, TierBytes(), rejected="refused by the settings' rules")
        needs = with_placement(self.base, cfg, self.tables)
        needs = needs.device_on_host() if self.on_cpu else needs
        per_tier = TierBytes.of(needs)
        short, missing = [], 0
        rows = cand.kind.rows_on_device(cand, self.total)
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

    def hot_sizes(self, kind: str, cache: int = 0) -> list[int]:
        """The hot budgets for `kind`, largest first: the profile's that a given `--hot-budget`
        allows, the largest that fits where a share's budget does not, and the given
        `--hot-budget` itself where it fits (what a user who names it would run by hand: weighed,
        and shown as dominated where it spares nothing over the profile's largest)."""
        mine = [b for b in self.budgets if self.rows_cap is None or b <= self.rows_cap]
        cap = self.largest_fitting(kind, cache)
        if self.rows_cap is not None:
            cap = min(cap, self.rows_cap // GRAIN * GRAIN)
        if cap >= GRAIN and (not mine or cap < max(mine) or self.rows_cap is not None):
            mine.append(cap)
        return sorted(set(mine), reverse=True)

    def caches(self, kind: str, hot: int) -> list[int]:
        """Row caches for `kind` (the tiered placement) with `hot` bytes of hot rows:
        CACHE_SHARES of the host room left (the cache's bookkeeping counted), no larger than the
        tier's rows."""
        probe = self.weigh(Candidate(kind, hot, SMALLEST))
        usable = self.usable("host")
        if probe.cfg is None or usable is None:
            return [SMALLEST]
        left = usable - probe.needs.on("host")
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


class Enumerator:
    """The default enumerator: every registered kind's candidates, kinds in registry order."""

    def __call__(self, space: CandidateSpace) -> list[Candidate]:
        return [c for kind in all_kinds() for c in kind.candidates(space)]

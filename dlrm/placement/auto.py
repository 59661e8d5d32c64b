"""`--placement auto`: where every row lives, chosen by predicted step time and memory.

    decision = Planner().plan(cfg, data, device)  # the candidates weighed, one chosen
    print(decision.table())                    # candidate, ms/step, memory per tier, why

1. The inventory (embeddings/room.py): what this process may use on the device (CUDA), in
   host DRAM and on the disk under `--scm-dir`. The dense part, its optimizer, the activations
   at the batch size and the loader come off it as dlrm/placement/memory_check.py counts them.
2. `device` first (any kind tuned by nothing that keeps every row on the device): when every
   table fits there, it is chosen with no further cost (no profile,
   no prediction): nothing is faster than every row in the fastest memory.
3. Otherwise one planning sample is read (dlrm/placement/candidates.py's PlanningSample: the access profile,
   made or reused as a run makes it, and the sparse features of SAMPLE_BATCHES evenly spread
   training batches the profile did not count), and the enumerator lists the candidates: each
   registered kind's (dlrm/placement/kinds.py): `host`; `fae`, `hotline` and `tiered` at the
   hot budgets where the profile's cumulative lookup share reaches HOT_SHARES (and the largest
   budget that fits, where a share's does not); `tiered` with DRAM row caches of CACHE_SHARES of
   the host room its hot rows leave (dlrm/placement/enumerator.py).
4. Each candidate's needs per tier are dlrm/placement/memory_check.py's (the same bounds the pre-flight check
   uses). It fits when every memory tier's needs are at most (1 - PLAN_MARGIN) of the room:
   the needs are bounds from budgets, and an allocator, a fragmented heap or a neighbour's growth
   take more than they say. The disk's need is exact and an upper bound (the tier's file is
   sparse until its blocks are written), so it gets no margin. A `--hot-budget` the user gave
   bounds the rows on the device too (`rows_cap`: auto's rule before the planner).
5. No degenerate candidate: a hot set too small to move fewer embedding bytes per sample than
   the placement without one, or than its kind's next smaller hot set (dlrm/placement/
   enumerator.py's `Coverage`, from the profile), is rejected as dominated, never predicted.
6. The predictor (by default each kind's `predict` from the installed performance model's step
   costs, perfmodel/placement_costs.py, found through the plugins when a plan starts) predicts
   each fitting candidate's step time; a candidate another beats on every predicted part is
   rejected as dominated; the fastest is chosen (ties: the kind's `preference`, then the least
   device and host memory).
   Without a predictor the first fitting candidate in order of the kinds' `preference` (a kind's
   largest budgets first) is chosen, and the table says so.
7. A close call (the top predictions within the model's own error of each other, or an
   uncalibrated model) is measured: the shortlist runs a few steps on the run's first batches
   and the measured fastest wins, within 3% of the run's predicted time
   (dlrm/placement/trials.py; `--placement-trial off|auto|always`).
   Where nothing fits: one line naming the closest candidate and the tier it is short on.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path

import numpy as np

from dlrm.config import TrainConfig
from dlrm.data import DataSplits, steps_per_epoch
from dlrm.errors import ConfigError
from dlrm.placement import decision_file
from dlrm.placement.candidates import (
    STREAM_BATCHES,
    Candidate,
    KindPredictor,
    PlanningSample,
    default_costs,
)
from dlrm.placement.decision_file import DECISION_NAME  # noqa: F401  (its name here too)
from dlrm.placement.enumerator import (
    PLAN_MARGIN,
    CandidateSpace,
    Coverage,
    Enumerator,
    Weighed,
    hot_budgets,
    rows_cap,
)
from dlrm.placement.kinds import all_kinds
from dlrm.placement.memory_check import check_batch
from dlrm.placement.needs import dense_needs, run_tables, with_candidate
from dlrm.placement.run_plan import obtain_profile, profile_training_sample, profiled_batches
from dlrm.placement.tiered_setup import scm_directory
from dlrm.placement.trials import Trial, TrialRunner
from embeddings import TableSpec
from embeddings.errors import PlacementError, ProfileError
from embeddings.room import MemoryInventory, Needs, fmt_bytes, inventory

__all__ = ["PLAN_MARGIN", "Decision", "Planner", "Weighed", "plan", "resolve_auto", "rows_cap"]

log = logging.getLogger(__name__)

SAMPLE_BATCHES = 8  # training batches whose sparse features a predictor replays
# the planning phases a decision times (`Decision.phases`): the room and the dense part's needs;
# the access profile and the sample's batches; the candidates listed, weighed and the degenerate
# ones dropped; the predictions (a first plan's calibration included); the trial
PHASES = ("inventory", "sample", "candidates", "prediction", "trial")


@dataclass
class Decision:
    """The candidates weighed, the one chosen and how (`how`), the room per tier, the margin."""

    chosen: Candidate
    how: str
    weighed: list[Weighed]
    room: dict[str, dict]
    margin: float = PLAN_MARGIN
    planning_s: float = 0.0
    trial: Trial | None = None  # the close call's measurements, or why there were none
    # seconds per planning phase (PHASES; what a slow plan spent its time on): the decision
    # file's `planning_phases_s`
    phases: dict[str, float] = field(default_factory=dict, compare=False)
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
        out = {
            "chosen": self.chosen.label(), "settings": self.chosen.settings(), "how": self.how,
            "margin": self.margin, "planning_s": round(self.planning_s, 3), "room": self.room,
            "candidates": [w.to_json() for w in self.weighed],
        }  # fmt: skip
        if self.trial is not None:
            out["trial"] = self.trial.to_json()
        if self.phases:
            out["planning_phases_s"] = {k: round(v, 3) for k, v in self.phases.items()}
        return out

    @classmethod
    def from_json(cls, d: dict, source: str = "placement decision") -> Decision:
        try:
            s = d["settings"]
            chosen = Candidate(s["placement"], int(s.get("hot_budget") or 0),
                               int(s.get("scm_cache") or 0))  # fmt: skip
            rows = [Weighed.from_json(w) for w in d.get("candidates", [])]
            trial = Trial.from_json(d["trial"]) if d.get("trial") is not None else None  # optional
            phases = {str(k): float(v) for k, v in (d.get("planning_phases_s") or {}).items()}
            return cls(chosen, str(d["how"]), rows, dict(d.get("room") or {}),
                       float(d.get("margin", PLAN_MARGIN)), float(d.get("planning_s", 0.0)),
                       trial, phases=phases)  # fmt: skip
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ConfigError(f"{source}: not a placement decision ({e})") from None

    def table(self) -> str:
        """The printed table: one row per candidate, the chosen one marked."""
        tiers = [t for t in ("device", "host", "disk") if t in self.room]
        # a trial's measurements beside the predictions: the column only where one measured
        trial = self.trial if self.trial is not None and self.trial.measured else None
        measured = ["measured"] if trial else []
        head = ["candidate", "ms/step", *measured, "bytes/sample", *tiers, ""]
        rows = []
        for w in self.weighed:
            p = w.prediction
            ms = f"{p.ms_per_step:.2f}" if p else "-"
            if trial:
                m = trial.median(w.candidate.label())
                ms = [ms, f"{m:.2f}" if m is not None else "-"]
            else:
                ms = [ms]
            moved = f"{w.moved:,.0f}" if w.moved is not None else "-"
            mem = [fmt_bytes(w.needs.on(t)) if w.needs.on(t) else "-" for t in tiers]
            why = "CHOSEN" if w.candidate == self.chosen else (w.rejected or "")
            if trial and w.candidate.label() == trial.winner:
                why = f"{why} (measured fastest)" if why else "measured fastest"
            rows.append([w.candidate.label(), *ms, moved, *mem, why])
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
        if self.trial is not None:
            lines.append(f"  trial: {self.trial.line}")
        if any(src.startswith("roofline") for src in sources):
            # without a fitted model the step's kernels are guessed from peak figures: say how
            # to get real ones, since the ranking of close candidates rests on them
            lines.append("  (a fitted model predicts this machine's steps: python -m perfmodel "
                         "microbench --out DIR, then python -m perfmodel fit --bench DIR)")  # fmt: skip
        return "\n".join(line.rstrip() for line in lines)


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
    return (c.kind.preference, -c.hot_budget, -c.scm_cache)


def _preference_order() -> str:
    return ", ".join(k.name for k in sorted(all_kinds(), key=lambda k: k.preference))


class RunMemory:
    """The planner's default memory estimator: what this process may use per tier (the
    inventory, embeddings/room.py) and what a run needs (the dense part; each candidate's
    placement on top, dlrm/placement/memory_check.py's count)."""

    def room(self, cfg: TrainConfig, device) -> MemoryInventory:
        return inventory(device, cfg.placing.memory_bytes(), cfg.placing.device_memory_bytes(),
                         scm_directory(cfg.scm, cfg.run_dir))  # fmt: skip

    def base(self, cfg: TrainConfig, data: DataSplits) -> Needs:
        return dense_needs(cfg, data)


INSTALLED = "installed"  # Planner's default predictor: the installed performance model's


class Planner:
    """`--placement auto` (module docstring), built from parts:

    `enumerator(space) -> [Candidate]`: the candidates (default: every registered kind's);
    `memory`: `room(cfg, device)` and `base(cfg, data)` (default RunMemory);
    `predictor(cfg, candidate, sample) -> Prediction` (default INSTALLED: each kind's prediction
    from the installed performance model's step costs, made afresh for each plan; None, or no
    performance model installed: the order of preference decides);
    `trials`: the trial runner that measures a close call's shortlist on the run's first
    batches (default: a TrialRunner, dlrm/placement/trials.py; None: the prediction decides).
    Nothing is kept between plans."""

    def __init__(self, enumerator=None, memory=None, predictor=INSTALLED, trials=INSTALLED,
                 margin: float = PLAN_MARGIN) -> None:  # fmt: skip
        self.enumerator = enumerator or Enumerator()
        self.memory = memory or RunMemory()
        self.predictor = predictor
        self.trials = TrialRunner() if trials is INSTALLED else trials
        self.margin = margin

    def with_margin(self, margin: float) -> Planner:
        return Planner(self.enumerator, self.memory, self.predictor, self.trials, margin)

    def _predictor(self):
        if self.predictor is not INSTALLED:
            return self.predictor
        costs = default_costs()
        return None if costs is None else KindPredictor(costs())

    def plan(self, cfg: TrainConfig, data: DataSplits, device, write: bool = True,
             measurer=None) -> Decision:  # fmt: skip
        """The decision for `cfg`; ConfigError (one line) where nothing fits. `write`: the access
        profile may be written (the run directory's, or `--profile-file`). `measurer`: how the
        trial builds a candidate's run (the run's own: dlrm/compose.py's `trial_contender`)."""
        t0 = time.perf_counter()
        phases: dict[str, float] = {}
        clock = [t0]

        def lap(phase: str) -> None:  # the time since the last phase ended, as `phase`'s
            now = time.perf_counter()
            phases[phase] = phases.get(phase, 0.0) + now - clock[0]
            clock[0] = now

        margin = self.margin
        tables = run_tables(cfg, data)
        base = self.memory.base(cfg, data)
        room = self.memory.room(cfg, device)
        space = CandidateSpace(cfg, tables, base, room, margin)
        shown_room = {t: {"bytes": r.bytes, "source": r.source}
                      for t in ("device", "host", "disk") if (r := room.on(t)) is not None}  # fmt: skip
        check_batch(cfg, base, room)  # before batches of that size are read for the profile
        # every row in the fastest memory: nothing is faster, so when it fits nothing is planned
        whole = [Candidate(k.name) for k in all_kinds() if not k.tuned_by
                 and k.rows_on_device(Candidate(k.name), space.total) == space.total]  # fmt: skip
        first = [space.weigh(c) for c in whole]
        fit_whole = [w for w in first if w.fits]
        if fit_whole:
            how = "every table fits on the device: nothing to plan"
            chosen = min(fit_whole, key=_preference)
            lap("inventory")
            return Decision(chosen.candidate, how, [chosen], shown_room, margin,
                            time.perf_counter() - t0, phases=phases)  # fmt: skip
        lap("inventory")
        sample = read_sample(cfg, data, tables, room, write)
        lap("sample")
        opt = cfg.training.sparse_optimizer()
        space.budgets = hot_budgets(sample.profile, tables, opt)
        seen = {w.candidate for w in first}
        weighed = first + [space.weigh(c) for c in self.enumerator(space) if c not in seen]
        fitting = [w for w in weighed if w.fits]
        if not fitting:
            raise ConfigError(_nothing_fits(weighed, margin))
        fitting = _drop_degenerate(fitting, Coverage(sample.profile, tables, opt))
        lap("candidates")
        fn = self._predictor()
        trial = None
        if fn is None:
            chosen = min(fitting, key=_preference)
            how = f"no performance model: chosen by preference ({_preference_order()})"
            for w in fitting:
                if w is not chosen:
                    w.rejected = "fits; later in the preference order"
        else:
            chosen, how, contenders = self._predicted(fn, cfg, fitting, sample, t0)
            lap("prediction")
            if self.trials is not None:  # a close call: measured on the run's first batches
                chosen, how, trial = self.trials.decide(cfg, data, device, contenders, fitting,
                                                        chosen, how, room, margin, measurer)  # fmt: skip
                lap("trial")
        del sample
        return Decision(chosen.candidate, how, weighed, shown_room, margin,
                        time.perf_counter() - t0, trial, phases=phases)  # fmt: skip

    def _predicted(self, fn, cfg, fitting: list[Weighed], sample, t0: float):
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
        predicted = _drop_dominated([w for w in fitting if w.prediction is not None])
        if not predicted:  # the model could predict none of them: the order of preference decides
            chosen = min(fitting, key=_preference)
            chosen.rejected = None
            return chosen, f"no prediction: chosen by preference ({_preference_order()})", []
        # equal predictions: the kind preferred, then of its candidates the one that needs the
        # least memory (a cache the run never fills reads as much as a larger one)
        chosen = min(predicted, key=lambda w: (
            round(w.prediction.ms_per_step, 3), w.candidate.kind.preference,
            w.needs.memory(), _preference(w)))  # fmt: skip
        best = chosen.prediction.ms_per_step
        for w in predicted:
            if w is not chosen:
                more = w.prediction.ms_per_step - best
                w.rejected = (f"slower (+{more:.2f} ms/step)" if round(more, 3) > 0 else
                              "predicted as fast: the tie goes to the preferred kind, then the "
                              "least memory")  # fmt: skip
        how = f"the fastest predicted of those that fit with a {self.margin:.0%} margin on memory"
        # the trial's contenders: every prediction, the dominated too (a part's prediction has
        # the model's error as much as the whole)
        return chosen, how, [w for w in fitting if w.prediction is not None]


def plan(
    cfg: TrainConfig, data: DataSplits, device, write: bool = True, margin: float = PLAN_MARGIN
) -> Decision:
    """The run's planner's decision for `cfg` (Planner.plan), without a run: no trial is
    measured (there is no run to build a candidate's from, and nothing is trained)."""
    planner = default_planner().with_margin(margin)
    planner.trials = None
    return planner.plan(cfg, data, device, write)


def default_planner() -> Planner:
    """The planner a run uses (`resolve_auto`, `plan`): the default parts."""
    return Planner()


# --- no degenerate candidates ---------------------------------------------------------------------

TOLERANCE = 1e-9
# a hot set must spare at least this share of the plain placement's bytes per sample: a saving
# below it is inside any step-time prediction's error (and the profile's sampling), so the
# candidate could only win by a tie-break, as FAE with a 3 KiB hot set once did
MIN_SAVING = 0.05


def _drop_degenerate(fitting: list[Weighed], coverage: Coverage) -> list[Weighed]:
    """The contenders among `fitting`: a hot set too small to spare MIN_SAVING of the embedding
    bytes per sample the placement without one moves (the plain placement, host), or that moves
    no fewer than the next smaller hot set of its kind (more memory for nothing), is rejected,
    saying by what. Kinds that do not know their bytes (None) stay."""
    for w in fitting:
        w.moved = w.candidate.kind.bytes_per_sample(w.candidate, coverage)
    plain = next((w for w in fitting if not w.candidate.kind.tuned_by and w.moved is not None
                  and abs(w.moved - coverage.plain) <= TOLERANCE), None)  # fmt: skip
    plain_name = plain.candidate.label() if plain else "the placement without a hot set"
    by_kind: dict[str, list[Weighed]] = {}
    for w in fitting:
        if "hot_budget" in w.candidate.kind.tuned_by and w.moved is not None:
            by_kind.setdefault(w.candidate.placement, []).append(w)
    for rows in by_kind.values():
        rows.sort(key=lambda w: (w.candidate.hot_budget, w.candidate.scm_cache))
        smaller: Weighed | None = None  # the contender of the next smaller hot set
        for _, group in groupby(rows, key=lambda w: w.candidate.hot_budget):
            kept = []
            for w in group:
                if w.moved > coverage.plain * (1 - MIN_SAVING) - TOLERANCE:
                    w.rejected = (f"dominated by {plain_name}: its hot set moves {w.moved:,.0f} "
                                  f"bytes per sample of its {coverage.plain:,.0f}")  # fmt: skip
                elif smaller is not None and w.moved >= smaller.moved - TOLERANCE:
                    w.rejected = (f"dominated by {smaller.candidate.label()}: no fewer bytes per "
                                  "sample with a larger hot set")  # fmt: skip
                else:
                    kept.append(w)
            smaller = kept[0] if kept else smaller
    return [w for w in fitting if not w.rejected]


def _drop_dominated(predicted: list[Weighed]) -> list[Weighed]:
    """Reject a candidate another one beats on every predicted part (no part slower, one
    faster): it can win on no weighting of the parts."""

    def parts(w: Weighed) -> dict[str, float]:
        return w.prediction.parts.to_json()

    out = []
    for w in predicted:
        mine = parts(w)
        for v in predicted:
            if v is w:
                continue
            theirs = parts(v)
            keys = set(mine) | set(theirs)
            no_worse = all(theirs.get(k, 0.0) <= mine.get(k, 0.0) + TOLERANCE for k in keys)
            better = any(theirs.get(k, 0.0) < mine.get(k, 0.0) - TOLERANCE for k in keys)
            if keys and no_worse and better:
                w.rejected = f"dominated by {v.candidate.label()} on every predicted part"
                break
        else:
            out.append(w)
    return out


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
    measurer=None,
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
            decision = default_planner().plan(cfg, data, device, measurer=measurer)
        decision.record = decision.to_json()
        decision_file.write(cfg.run_dir / DECISION_NAME, decision.record)
    print(decision.table(), flush=True)
    return applied(cfg, decision), decision


def applied(cfg: TrainConfig, decision: Decision) -> TrainConfig:
    """`cfg` with the chosen candidate's settings (`with_candidate`)."""
    from dlrm.placement.run_plan import PROFILE_NAME

    return with_candidate(cfg, decision.chosen, cfg.run_dir / PROFILE_NAME)

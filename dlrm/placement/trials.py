"""The placement trial: the planner's close calls measured on the run's own first batches.

    runner = TrialRunner()                     # the Planner's `trials` (dlrm/placement/auto.py)
    chosen, how, trial = runner.decide(...)    # the measured fastest of the shortlist, or as predicted

A step-time prediction has an error (a fitted model's was 12-34% absolute on a shared machine,
where the same configuration also measured 9.5 and 15.2 ms/step twenty minutes apart), so when
the top predictions lie within it of each other the ranking is a coin toss the run can settle
itself, cheaply, before it commits to a placement:

1. The error: the largest `detail["error"]` (a relative error, e.g. 0.15) a prediction of the
   contenders carries (a calibrated predictor says its own), else DEFAULT_ERROR. A roofline
   (uncalibrated) prediction's ranking is always a close call.
2. A close call: another contender's prediction within the error of the fastest's (their
   intervals [ms(1-e), ms(1+e)] overlap). `--placement-trial always` treats every plan as one,
   `off` none.
3. The shortlist: the SHORTLIST fastest predicted of the close ones, and the plain placement that
   fits as the floor (device if every table fits, else host) when it is not among them.
4. The budget: the trial's whole cost at most BUDGET_SHARE of the run's predicted time (the
   chosen ms/step x the run's steps). Predicted first: building each candidate (`build_s`: its
   tables' bytes initialised, and FAE's split of the epoch into hot and cold batches, at rates
   measured on this machine class), its warm-up and its timed steps (at its predicted ms/step);
   as many rounds as fit, up to MAX_ROUNDS; under MIN_ROUNDS the trial is skipped, saying so in
   one line. Then counted: once the candidates are built and warmed, the rounds are re-counted
   from what that really took and the warm-up steps' own times, and where MIN_ROUNDS no longer
   fit, the trial stops and the run chooses by prediction, saying so (`always` measures
   MIN_ROUNDS whatever the budget).
5. The measurement: each candidate's run built as the run builds it (its collection, model, FAE
   schedule, dense optimizer and train pipeline: dlrm/compose.py's `trial_contender`, the
   measurer the run gives) in a temporary
   directory, WARMUP steps each, then rounds of timed steps interleaved (A B C A B C ...,
   the host's speed drifts), the median of each candidate's rounds. A round is STEPS steps, or
   up to LONG_STEPS where the budget pays for MAX_ROUNDS of them (a 3-step round of a few ms
   is at the mercy of one hiccup). Each candidate's timed block ends once its own background
   work (a staging worker's batches in flight) is done: it pays for its own staging, and its
   worker never runs beside the next candidate's steps. Every candidate is kept
   built at once when their memory needs together fit the room with the planner's margin, else
   they are measured one after another (the line says so: drift is then not cancelled).
6. Nothing of the run is touched: the global RNGs (torch, CUDA, numpy, python) are restored, the
   run's data iterator is never made, and nothing is written to the run directory (the decision
   file records the trial: dlrm/placement/auto.py's `Decision.to_json`).
"""

from __future__ import annotations

import gc
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from dlrm.placement.candidates import Candidate
from dlrm.settings.placement import TRIAL_MODES

MODES = TRIAL_MODES  # --placement-trial's
DEFAULT_ERROR = 0.25  # a predictor's relative error when it states none (the fitted model's
# absolute errors were 12-34% on a shared machine)
BUDGET_SHARE = 0.03  # of the run's predicted time the trial may cost at most
SHORTLIST = 3  # the fastest predicted measured at most (and the floor)
WARMUP = 1  # untimed steps per candidate before the rounds (first-touch, allocator, caches)
STEPS = 3  # timed steps per candidate per round, at least
LONG_STEPS = (12, 6)  # per round where the budget pays for MAX_ROUNDS of them
MIN_ROUNDS, MAX_ROUNDS = 2, 5
# Building a candidate's run (dlrm/compose.py's `trial_contender`): a fixed part (the model, the
# optimizer, the pipeline), its tables' bytes initialised in memory or written to the SSD tier,
# and where the kind regroups the batches (FAE) every lookup of the epoch classified hot or
# cold. Measured 1.0-1.2 GB/s and 350M lookups/s on the 2-core EPYC
# (docs/measurements/planner.md); predicted at half that pace
BUILD_FIXED_S = 0.05
BUILD_S_PER_BYTE = 1.0 / 0.5e9
SPLIT_S_PER_LOOKUP = 1.0 / 175e6


def too_short(steps: int) -> str:
    """The line of a run whose budget does not pay for a minimal trial."""
    return f"run too short for a trial ({steps} steps): chose by prediction"


def estimated_build_s(w, lookups_per_epoch: int) -> float:
    """The predicted seconds to build candidate `w`'s run for the trial (BUILD_* above)."""
    split = lookups_per_epoch * SPLIT_S_PER_LOOKUP if w.candidate.kind.regroups_batches else 0.0
    written = w.needs.memory() + w.needs.on("disk")
    return BUILD_FIXED_S + written * BUILD_S_PER_BYTE + split


# --- the record -----------------------------------------------------------------------------------


@dataclass
class Trial:
    """What the trial did: `line` says it in one line (measured, or why not); `measured`: each
    shortlisted candidate's ms/step per round (label -> list); `cost_s` the seconds it took,
    `estimate_s` its predicted cost (`builds_s` of it building the candidates), `budget_s` what
    it was allowed; `built_s` what building and warming them all took (built together), or
    measuring the first ones before the trial stopped (one after another)."""

    mode: str
    line: str
    error: float | None = None  # None: the predictions are uncalibrated (roofline)
    shortlist: list[str] = field(default_factory=list)
    rounds: int = 0
    steps: int = STEPS
    warmup: int = WARMUP
    together: bool = True
    measured: dict[str, list[float]] = field(default_factory=dict)
    winner: str | None = None
    budget_s: float = 0.0
    estimate_s: float = 0.0
    cost_s: float = 0.0
    builds_s: float = 0.0
    built_s: float = 0.0

    def median(self, label: str) -> float | None:
        times = self.measured.get(label)
        return float(statistics.median(times)) if times else None

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode, "line": self.line, "error": self.error,
            "shortlist": list(self.shortlist), "rounds": self.rounds, "steps": self.steps,
            "warmup": self.warmup, "together": self.together,
            "measured_ms": {k: [round(v, 4) for v in vs] for k, vs in self.measured.items()},
            # a trial stopped part way has shortlisted placements it never measured
            "median_ms": {k: round(m, 4) for k in self.measured if (m := self.median(k)) is not None},
            "winner": self.winner, "budget_s": round(self.budget_s, 3),
            "estimate_s": round(self.estimate_s, 3), "cost_s": round(self.cost_s, 3),
            "builds_s": round(self.builds_s, 3), "built_s": round(self.built_s, 3),
        }  # fmt: skip

    @classmethod
    def from_json(cls, d: dict) -> Trial:
        """The record a decision file holds (KeyError/TypeError/ValueError where it is not one)."""
        err = d.get("error")
        return cls(
            str(d["mode"]), str(d["line"]), None if err is None else float(err),
            [str(x) for x in d.get("shortlist") or []], int(d.get("rounds", 0)),
            int(d.get("steps", STEPS)), int(d.get("warmup", WARMUP)), bool(d.get("together", True)),
            {str(k): [float(v) for v in vs] for k, vs in (d.get("measured_ms") or {}).items()},
            d.get("winner"), float(d.get("budget_s", 0.0)), float(d.get("estimate_s", 0.0)),
            float(d.get("cost_s", 0.0)), float(d.get("builds_s", 0.0)),
            float(d.get("built_s", 0.0)),
        )  # fmt: skip


# --- who measures ---------------------------------------------------------------------------------


class Contender(Protocol):
    """One candidate's run, built: `step()` one training step, `wait()` until the device and
    any background worker of its own have finished what was queued, `close()` lets it go."""

    def step(self) -> None: ...

    def wait(self) -> None: ...

    def close(self) -> None: ...


# (the candidate's TrainConfig, the run's data, the device) -> Contender
Measurer = Callable[[Any, Any, torch.device], Contender]


class Stepping:
    """A built candidate run (dlrm/compose.py's `trial_contender`) as a Contender."""

    def __init__(self, pipeline, train, device: torch.device, parts: list) -> None:
        self.pipeline, self.device, self.parts = pipeline, device, parts
        self.batches = _forever(train)

    def step(self) -> None:
        self.pipeline.progress(self.batches)

    def wait(self) -> None:
        """Until the device and this run's own staging worker are done: the next candidate's
        steps run without this one's work beside them."""
        settle = getattr(self.pipeline, "settle", None)
        if settle is not None:
            settle()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        settle = getattr(self.pipeline, "settle", None)
        if settle is not None:  # a staging worker's work in flight, finished before it goes
            settle()
        self.pipeline = self.batches = None
        self.parts.clear()


def _forever(train) -> Iterator:
    """The candidate's own iterator over epoch 0 from its first batch, again from the start when
    a short epoch ends (never the run's iterator: the run makes its own later)."""
    while True:
        yield from train.batches(0)


@contextmanager
def untouched_rng(device: torch.device):
    """The global random states as they were on entry, whatever the body draws: the run that
    follows draws the same numbers as one without a trial (bit-identical to a placement given
    by hand)."""
    py, npy = random.getstate(), np.random.get_state()
    devices = []
    if device.type == "cuda":
        devices = [device.index if device.index is not None else torch.cuda.current_device()]
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)


# --- the runner -----------------------------------------------------------------------------------


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _ms(w) -> float:
    return float(w.prediction.ms_per_step)


class TrialRunner:
    """The Planner's `trials` (module docstring). `measurer` builds a candidate's run (default:
    the one `decide` is given, the run's: dlrm/compose.py's `trial_contender`); `clock` reads
    seconds (default time.perf_counter); `build_s` predicts a candidate's build (default
    `estimated_build_s`); all are arguments so that a test decides what is measured. `say`
    prints the progress lines."""

    def __init__(self, measurer: Measurer | None = None, clock: Callable[[], float] | None = None,
                 say: Callable[[str], None] = _say, share: float = BUDGET_SHARE,
                 default_error: float = DEFAULT_ERROR,
                 build_s: Callable[[Any, int], float] = estimated_build_s) -> None:  # fmt: skip
        self.measurer = measurer  # None: the one `decide` is given (the run's: dlrm/compose.py)
        self.clock = clock or time.perf_counter
        self.say, self.share, self.default_error = say, share, default_error
        self.build_s = build_s

    # -- the rules (pure: tested with injected predictions) --

    def error(self, contenders: list) -> float | None:
        """The relative error of the contenders' predictions; None: uncalibrated (roofline)."""
        details = [w.prediction.detail for w in contenders]
        if any(str(d.get("source", "")).startswith("roofline") for d in details):
            return None
        stated = [float(d["error"]) for d in details if d.get("error") is not None]
        return max(stated) if stated else self.default_error

    @staticmethod
    def close_ones(contenders: list, error: float | None) -> list:
        """The contenders, fastest predicted first, whose prediction is within `error` of the
        fastest's (None: all of them)."""
        ranked = sorted(contenders, key=_ms)
        if error is None or not ranked:
            return ranked
        best = _ms(ranked[0])
        return [w for w in ranked if _ms(w) * (1 - error) <= best * (1 + error)]

    @staticmethod
    def floor(fitting: list):
        """The plain placement that fits: device when every table fits, else host (None: neither
        fits, e.g. only the SSD tier holds the tables)."""
        by = {w.candidate: w for w in fitting}
        return by.get(Candidate("device")) or by.get(Candidate("host"))

    def shortlist(self, close: list, fitting: list) -> list:
        """At most SHORTLIST of `close` (fastest first) and the floor."""
        out = list(close[:SHORTLIST])
        plain = self.floor(fitting)
        if plain is not None and plain not in out:
            out.append(plain)
        return out

    @staticmethod
    def rounds(costs_ms: list[float], budget_s: float, warmup: int = WARMUP,
               steps: int = STEPS) -> int:  # fmt: skip
        """The most rounds (up to MAX_ROUNDS) of `steps` steps whose cost (`costs_ms`: each
        shortlisted candidate's ms/step, `warmup` steps each first) fits `budget_s`; 0: not even
        MIN_ROUNDS do."""
        per_step = sum(costs_ms) / 1e3
        for r in range(MAX_ROUNDS, MIN_ROUNDS - 1, -1):
            if per_step * (warmup + r * steps) <= budget_s:
                return r
        return 0

    @classmethod
    def steps_per_round(cls, costs_ms: list[float], budget_s: float) -> int:
        """LONG_STEPS' longest whose MAX_ROUNDS fit `budget_s`, else STEPS."""
        for steps in LONG_STEPS:
            if cls.rounds(costs_ms, budget_s, steps=steps) == MAX_ROUNDS:
                return steps
        return STEPS

    # -- the decision --

    def decide(self, cfg, data, device, contenders: list, fitting: list, chosen, how: str,
               room, margin: float, measurer: Measurer | None = None):  # fmt: skip
        """(chosen Weighed, how, Trial | None): the measured fastest of the shortlist when the call
        is close and the budget pays for it, else `chosen` and `how` as predicted."""
        from dlrm.data import bag_sizes, steps_per_epoch

        mode = cfg.placing.placement_trial
        if mode == "off":
            return chosen, how, Trial(mode, "off (--placement-trial off): chose by prediction")
        if not contenders:
            return chosen, how, None
        measurer = self.measurer or measurer
        if measurer is None:  # a plan without a run (`dlrm.placement.auto.plan`) builds none
            return chosen, how, Trial(mode, "no run to measure in: chose by prediction")
        error = self.error(contenders)
        close = self.close_ones(contenders, error)
        listed = self.shortlist(close if mode == "auto" else sorted(contenders, key=_ms), fitting)
        said = "uncalibrated predictions" if error is None else f"the model's error {error:.0%}"
        if len(listed) < 2:
            return chosen, how, Trial(mode, "one placement to weigh: nothing to measure", error)
        if mode == "auto" and len(close) < 2 and error is not None:
            line = (f"not a close call: the fastest predicted leads the next by more than "
                    f"{said}")  # fmt: skip
            return chosen, how, Trial(mode, line, error)
        # the floor may have failed its prediction: it is costed as the slowest contender
        slowest = max(_ms(v) for v in contenders)
        costs = [_ms(w) if w.prediction else slowest for w in listed]
        per_epoch = steps_per_epoch(cfg, data)
        run_steps = per_epoch * cfg.training.nepochs
        budget = self.share * _ms(chosen) * run_steps / 1e3
        bags = bag_sizes(cfg.data, len(data.table_sizes)) or [1] * len(data.table_sizes)
        lookups = per_epoch * cfg.training.mini_batch_size * sum(bags)
        builds = sum(self.build_s(w, lookups) for w in listed)
        rounds = self.rounds(costs, budget - builds)
        if rounds == 0 and mode == "always":
            rounds = MIN_ROUNDS
        labels = [w.candidate.label() for w in listed]
        steps = self.steps_per_round(costs, budget - builds) if rounds else STEPS
        trial = Trial(mode, too_short(run_steps), error, labels, rounds, steps, budget_s=budget,
                      builds_s=builds)  # fmt: skip
        if rounds == 0:
            self.say(f"--placement auto: {trial.line}")
            return chosen, how, trial
        trial.estimate_s = builds + sum(costs) * (WARMUP + rounds * steps) / 1e3
        trial.together = _fit_together(listed, room, margin)
        if not self._measure(measurer, cfg, data, device, listed, trial):
            self.say(f"--placement auto: {trial.line}")
            return chosen, how, trial
        winner = min(listed, key=lambda w: trial.median(w.candidate.label()))
        trial.winner = winner.candidate.label()
        best = trial.median(trial.winner)
        for w in listed:
            if w is not winner:
                more = trial.median(w.candidate.label()) - best
                w.rejected = f"measured slower (+{more:.2f} ms/step)"
        winner.rejected = None
        why = {"always": "--placement-trial always"}.get(mode, f"predictions within {said}")
        trial.line = (f"{trial.rounds} rounds x {steps} steps (+{WARMUP} warm-up) of {len(listed)} "
                      f"placements on the run's first batches"
                      f"{'' if trial.together else ', one after another (together they exceed memory)'}"
                      f": {trial.cost_s:.1f} s (budget {budget:.1f} s); measured fastest: "
                      f"{trial.winner}")  # fmt: skip
        how = f"the fastest measured of {len(listed)} shortlisted ({why})"
        return winner, how, trial

    def _measure(self, measurer, cfg, data, device, listed: list, trial: Trial) -> bool:
        """Measure `trial.shortlist` into `trial`; False where building and warming them took
        what the rounds needed of the budget (`trial.line` says so: choose by prediction)."""
        t0 = self.clock()
        self.say(f"--placement auto: measuring {len(listed)} placements on the run's first "
                 f"batches ({trial.rounds} rounds x {trial.steps} steps + {WARMUP} warm-up each; "
                 f"predicted {trial.estimate_s:.1f} s with their builds, of a "
                 f"{trial.budget_s:.1f} s budget)")  # fmt: skip
        trial.measured = {label: [] for label in trial.shortlist}
        with tempfile.TemporaryDirectory(prefix="placement-trial-") as tmp, untouched_rng(device):
            configs = [_trial_config(cfg, w.candidate, Path(tmp) / str(i))
                       for i, w in enumerate(listed)]  # fmt: skip
            if trial.together:
                done = self._together(measurer, configs, data, device, trial, t0)
            else:
                done = self._in_turn(measurer, configs, data, device, trial, t0)
            gc.collect()  # the trial's tables go before the run makes its own
            if device.type == "cuda":
                torch.cuda.empty_cache()
        trial.cost_s = self.clock() - t0
        return done

    def _together(self, measurer, configs, data, device, trial: Trial, t0: float) -> bool:
        """Every candidate built and warmed, then the rounds interleaved: as many as the budget
        still pays for at the warm-up steps' own times."""
        opened = []
        try:
            warm_ms = []
            for c_cfg in configs:
                opened.append(measurer(c_cfg, data, device))
                warm_ms.append(self._warm(opened[-1]))
            trial.built_s = self.clock() - t0
            if trial.mode != "always":
                left = self.rounds(warm_ms, trial.budget_s - trial.built_s, 0, trial.steps)
                if left == 0:
                    trial.line = self._overran(trial)
                    return False
                trial.rounds = min(trial.rounds, left)
            for r in range(trial.rounds):
                for label, c in zip(trial.shortlist, opened):
                    trial.measured[label].append(self._timed(c, trial.steps))
                self._progress(trial, r, t0)
        finally:
            for c in opened:
                c.close()
            del opened
        return True

    def _in_turn(self, measurer, configs, data, device, trial: Trial, t0: float) -> bool:
        """One candidate after another (together they exceed memory): each built, warmed and
        measured, the next only where the budget still pays for it at the pace so far."""
        for i, (label, c_cfg) in enumerate(zip(trial.shortlist, configs)):
            spent = self.clock() - t0
            if i and trial.mode != "always" and spent * len(configs) / i > trial.budget_s:
                trial.built_s = spent
                trial.line = self._overran(trial, i)
                return False
            c = measurer(c_cfg, data, device)
            try:
                self._warm(c)
                for _ in range(trial.rounds):
                    trial.measured[label].append(self._timed(c, trial.steps))
            finally:
                c.close()
                del c
            self.say(f"  {label}: {statistics.median(trial.measured[label]):.2f} ms/step "
                     f"({self.clock() - t0:.0f} s so far)")  # fmt: skip
        return True

    @staticmethod
    def _overran(trial: Trial, measured: int | None = None) -> str:
        trial.rounds = 0  # none measured for every candidate: nothing to compare
        n = len(trial.shortlist)
        if measured is None:  # built together: their builds and warm-ups left too little
            took = f"building the {n} placements took {trial.built_s:.1f} s"
        else:  # in turn: at the pace of the first ones the rest would overrun
            took = f"the first {measured} of {n} placements took {trial.built_s:.1f} s to measure"
        return (f"{took} (predicted {trial.estimate_s:.1f} s with the builds) of the "
                f"{trial.budget_s:.1f} s budget: chose by prediction")  # fmt: skip

    def _warm(self, c: Contender) -> float:
        """The warm-up steps; their ms/step."""
        t = self.clock()
        for _ in range(WARMUP):
            c.step()
        c.wait()
        return (self.clock() - t) * 1e3 / max(WARMUP, 1)

    def _timed(self, c: Contender, steps: int) -> float:
        t = self.clock()
        for _ in range(steps):
            c.step()
        c.wait()
        return (self.clock() - t) * 1e3 / steps

    def _progress(self, trial: Trial, r: int, t0: float) -> None:
        shown = ", ".join(f"{k} {v[-1]:.2f}" for k, v in trial.measured.items())
        self.say(f"  round {r + 1}/{trial.rounds}: {shown} ms/step "
                 f"({self.clock() - t0:.0f} s so far)")  # fmt: skip


def _fit_together(listed: list, room, margin: float) -> bool:
    """Do the shortlist's memory needs, summed, fit each memory tier's room with the margin?"""
    for tier in ("device", "host"):
        have = room.on(tier) if room is not None else None
        if have is None:
            continue
        if sum(w.needs.on(tier) for w in listed) > have.bytes * (1 - margin):
            return False
    return True


def _trial_config(cfg, candidate: Candidate, directory: Path):
    """The run's configuration with `candidate` applied as the run applies it (needs.py's
    `with_candidate`: the planner's access profile reused), writing only under `directory`:
    its own run directory and SSD tier, no resume, no file the user named that is not there
    yet (a plan or profile would be written to it)."""
    from dlrm.placement.needs import with_candidate
    from dlrm.placement.run_plan import PROFILE_NAME

    plan, profile = cfg.placing.placement_plan, cfg.placing.profile_file
    base = cfg.replace(
        out_dir=str(directory), resume=None, save_model=None, load_model=None,
        placement_plan=plan if plan and Path(plan).with_suffix(".npz").is_file() else None,
        profile_file=profile if profile and Path(profile).is_file() else None,
        scm_dir=str(directory / "scm"),
    )  # fmt: skip
    return with_candidate(base, candidate, cfg.run_dir / PROFILE_NAME)

"""The placement trial (dlrm/placement/trials.py): a close call's shortlist measured on the run's
first batches. The rules with injected predictions; the measured fastest wins with a measurer
and clock the test controls; the budget's skip line; the decision file's record; a run whose
trial chose X ends bit-identical to X given by hand; the trial on CUDA."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from dlrm.compose import trial_contender
from dlrm.data import build_data, steps_per_epoch
from dlrm.placement import auto as planner
from dlrm.placement import trials
from dlrm.placement.auto import DECISION_NAME, Decision, Planner
from dlrm.placement.candidates import Candidate, Prediction, StepTime, TierBytes
from dlrm.placement.enumerator import Weighed
from dlrm.placement.trials import Trial, TrialRunner, too_short
from dlrm.trainer import Trainer
from tests.dlrm.conftest import assert_resumed_exactly
from tests.dlrm.test_planner import BIG, CPU, MiB, fake_ms, fixed_room


def row(placement: str, ms: float, hot: int = 0, **detail) -> Weighed:
    return Weighed(Candidate(placement, hot), TierBytes(), Prediction(ms, detail=detail))


# --- the rules ------------------------------------------------------------------------------------


def test_a_close_call_is_within_the_models_own_error():
    runner = TrialRunner()
    a, b, c = row("hotline", 10.0, 1024), row("fae", 16.0, 1024), row("host", 17.0)
    # no stated error: DEFAULT_ERROR (25%): [7.5, 12.5] meets 16's [12, 20], not 17's [12.75, ..]
    assert runner.error([a, b, c]) == trials.DEFAULT_ERROR == 0.25
    assert runner.close_ones([c, b, a], 0.25) == [a, b]
    # a predictor that states its error (detail["error"]) is taken at its word, the largest one
    a, b = row("hotline", 10.0, 1024, error=0.1), row("fae", 12.0, 1024, error=0.05)
    assert runner.error([a, b]) == 0.1
    assert runner.close_ones([a, b], 0.1) == [a, b]  # 12 x 0.9 = 10.8 <= 11
    assert runner.close_ones([a, row("fae", 12.5, 1024)], 0.1) == [a]  # 11.25 > 11
    # an uncalibrated (roofline) prediction among them: every contender is a close call
    r = row("host", 40.0, source="roofline (no fitted model)")
    assert runner.error([a, r]) is None
    assert runner.close_ones([r, a], None) == [a, r]


def test_the_shortlist_is_the_three_fastest_and_the_plain_placement_as_the_floor():
    runner = TrialRunner()
    host = row("host", 30.0)
    close = [row("hotline", 10.0 + i, 1024 * (i + 1)) for i in range(5)]
    fitting = [*close, host]
    assert runner.shortlist(close, fitting) == [*close[:3], host]
    # the floor is device where every table fits, and it is not listed twice
    device = row("device", 9.0)
    assert runner.shortlist([device, *close], [device, *fitting]) == [device, *close[:2]]
    assert runner.shortlist(close[:1], [close[0], host]) == [close[0], host]


def test_rounds_are_as_many_as_the_budget_pays_for():
    # per round: 3 steps of (10 + 20) ms; a warm-up step first
    assert TrialRunner.rounds([10.0, 20.0], budget_s=0.03 * 7) == 2
    assert TrialRunner.rounds([10.0, 20.0], budget_s=0.03 * 13) == 4
    assert TrialRunner.rounds([10.0, 20.0], budget_s=10.0) == trials.MAX_ROUNDS
    assert TrialRunner.rounds([10.0, 20.0], budget_s=0.03 * 7 - 1e-9) == 0


# --- the decision, with a measurer and a clock the test controls -----------------------------------


def candidate_of(cfg) -> Candidate:
    """The candidate a trial configuration was made for."""
    kind = Candidate(cfg.placing.placement).kind
    sizes = {"hot_budget": cfg.placing.hot_budget.bytes, "scm_cache": cfg.scm.cache.bytes}
    return Candidate(cfg.placing.placement, **{s: sizes[s] for s in kind.tuned_by})


class FakeTimes:
    """A clock that moves only when a fake candidate steps, by that candidate's chosen time."""

    def __init__(self, ms_of) -> None:
        self.now, self.ms_of, self.order, self.built = 0.0, ms_of, [], []

    def clock(self) -> float:
        return self.now

    def measurer(self, cfg, data, device):
        c = candidate_of(cfg)
        self.built.append((c, Path(cfg.out_dir)))
        times = self

        class Fake:
            def step(self) -> None:  # a step draws from every global generator, as a run's may
                torch.rand(1), np.random.rand(), random.random()
                times.order.append(c)
                times.now += times.ms_of(c) / 1e3

            def wait(self) -> None:
                pass

            def close(self) -> None:
                pass

        return Fake()


def predicted_planner(times: FakeTimes | None, **kw) -> Planner:
    def predict(cfg, candidate, sample):
        return Prediction.of(StepTime(dense=fake_ms(candidate)))

    runner = TrialRunner(times.measurer, times.clock, **kw) if times else None
    return Planner(predictor=predict, trials=runner)


def test_the_measured_fastest_wins_and_the_table_shows_both(make_config, monkeypatch, capsys):
    fixed_room(monkeypatch, device=2 * MiB)
    cfg = make_config(**BIG)
    data = build_data(cfg)
    before = predicted_planner(None).plan(cfg, data, CPU, write=False)
    assert before.chosen.placement == "hotline"  # as predicted
    # measured: host (the floor, predicted slowest) fastest; the predicted choice slowest
    times = FakeTimes(
        lambda c: 1.0 if c.placement == "host" else 5.0 if c == before.chosen else 3.0
    )
    rng = torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()
    d = predicted_planner(times, share=100.0).plan(cfg, data, CPU, write=False)
    # the trial's steps drew numbers, the run draws the same as without them
    assert torch.equal(torch.get_rng_state(), rng[0]) and random.getstate() == rng[2]
    assert np.array_equal(np.random.get_state()[1], rng[1])
    t = d.trial
    assert d.chosen == Candidate("host") and t.winner == "host"
    assert len(t.shortlist) == 4 and t.shortlist[-1] == "host" and t.rounds == trials.MAX_ROUNDS
    assert t.shortlist[0] == before.chosen.label()
    assert t.measured["host"] == pytest.approx([1.0] * t.rounds)
    assert t.median(t.shortlist[0]) == pytest.approx(5.0)
    assert (
        d.how == "the fastest measured of 4 shortlisted (predictions within the model's error 25%)"
    )
    # interleaved: every candidate's warm-up, then rounds of A B C D, each STEPS steps
    built = [c for c, _ in times.built]
    assert [x.label() for x in built] == t.shortlist
    warm = trials.WARMUP * len(built)
    assert t.steps == trials.LONG_STEPS[0]  # a budget that pays for long rounds gets them
    one_round = [c for c in built for _ in range(t.steps)]
    assert times.order[warm:] == one_round * t.rounds
    # nothing written to the run directory: each candidate ran in its own temporary directory
    assert all(not p.is_relative_to(cfg.run_dir) and not p.exists() for _, p in times.built)
    assert not (cfg.run_dir / "placement_plan.npz").exists()
    table = d.table().splitlines()
    assert table[2].split()[:3] == ["candidate", "ms/step", "measured"]
    host_line = next(x for x in table if x.strip().startswith("host "))
    assert host_line.split()[1:3] == [f"{fake_ms(Candidate('host')):.2f}", "1.00"]
    assert host_line.endswith("CHOSEN (measured fastest)")
    first = next(x for x in table if x.strip().startswith(before.chosen.label() + " "))
    assert first.endswith("measured slower (+4.00 ms/step)")
    assert f"  trial: {t.rounds} rounds x {t.steps} steps (+1 warm-up) of 4 placements" in d.table()
    err = capsys.readouterr().err
    assert "--placement auto: measuring 4 placements on the run's first batches" in err
    assert f"  round {t.rounds}/{t.rounds}: " in err


def test_a_short_run_skips_the_trial_in_one_line(make_config, monkeypatch, capsys):
    fixed_room(monkeypatch, device=2 * MiB)
    cfg = make_config(**BIG)
    times = FakeTimes(lambda c: 1.0)
    data = build_data(cfg)
    d = predicted_planner(times).plan(cfg, data, CPU, write=False)
    steps = steps_per_epoch(cfg, data) * cfg.training.nepochs
    line = too_short(steps)
    assert line == f"run too short for a trial ({steps} steps): chose by prediction"
    assert f"--placement auto: {line}\n" in capsys.readouterr().err
    assert d.trial.line == line and not times.built and d.chosen.placement == "hotline"
    assert f"  trial: {line}" in d.table() and "measured" not in d.table()


class SlowBuilds(FakeTimes):
    """FakeTimes whose every build takes `build_s` seconds of the clock."""

    def __init__(self, ms_of, build_s: float) -> None:
        super().__init__(ms_of)
        self.build_s = build_s

    def measurer(self, cfg, data, device):
        self.now += self.build_s
        return super().measurer(cfg, data, device)


def test_the_budget_counts_the_predicted_builds(make_config, monkeypatch, capsys):
    fixed_room(monkeypatch, device=2 * MiB)
    cfg = make_config(**BIG)
    times = FakeTimes(lambda c: 1.0)
    runner = TrialRunner(times.measurer, times.clock, share=100.0, build_s=lambda w, n: 1e6)
    d = Planner(predictor=predicted_planner(None).predictor, trials=runner).plan(
        cfg, build_data(cfg), CPU, write=False
    )
    assert d.trial.line.startswith("run too short for a trial") and not times.built
    assert d.trial.builds_s == pytest.approx(1e6 * len(d.trial.shortlist))
    # FAE's split of the epoch into hot and cold batches is part of its build
    fae, host = Weighed(Candidate("fae", 1), TierBytes(host=10**9)), Weighed(Candidate("host"),
                                                                            TierBytes(host=10**9))  # fmt: skip
    assert trials.estimated_build_s(host, 10**8) == pytest.approx(
        trials.BUILD_FIXED_S + 1e9 * trials.BUILD_S_PER_BYTE
    )
    # the SSD tier's bytes are written when it is built
    tiered = Weighed(Candidate("tiered", 1, 1), TierBytes(host=10**8, disk=9 * 10**8))
    assert trials.estimated_build_s(tiered, 10**8) == trials.estimated_build_s(host, 10**8)
    assert trials.estimated_build_s(fae, 10**8) == pytest.approx(
        trials.estimated_build_s(host, 10**8) + 1e8 * trials.SPLIT_S_PER_LOOKUP
    )


def _with_builds(make_config, monkeypatch, together: bool, build_s):
    """(a plan whose candidates build free, a plan whose builds take `build_s(free trial)` each
    on the clock, predicted free both times): steps of 10 ms, a budget of 100 shares."""
    fixed_room(monkeypatch, device=2 * MiB)
    monkeypatch.setattr(trials, "_fit_together", lambda *a: together)
    cfg = make_config(**BIG)
    data = build_data(cfg)
    free = FakeTimes(lambda c: 10.0)
    runner = TrialRunner(free.measurer, free.clock, share=100.0, build_s=lambda w, n: 0.0)
    planned = Planner(predictor=predicted_planner(None).predictor, trials=runner)
    before = planned.plan(cfg, data, CPU, write=False)
    slow = SlowBuilds(lambda c: 10.0, build_s(before.trial))
    runner = TrialRunner(slow.measurer, slow.clock, share=100.0, build_s=lambda w, n: 0.0)
    after = Planner(predictor=planned.predictor, trials=runner).plan(cfg, data, CPU, write=False)
    return before, after, slow


@pytest.mark.parametrize("together", [True, False])
def test_builds_slower_than_predicted_stop_the_trial_within_its_budget(
    make_config, monkeypatch, together
):
    # each build takes 0.6 of the budget: the trial stops, and the run chooses by prediction
    before, d, slow = _with_builds(make_config, monkeypatch, together, lambda t: 0.6 * t.budget_s)
    budget, n = before.trial.budget_s, len(before.trial.shortlist)
    assert before.trial.rounds == trials.MAX_ROUNDS and n >= 3  # free builds: every round fits
    t = d.trial
    said = f"building the {n} placements took " if together else f"the first 1 of {n} placements"
    assert t.line.startswith(said), t.line
    assert t.line.endswith(f"of the {budget:.1f} s budget: chose by prediction")
    assert d.chosen.placement == "hotline" and t.winner is None
    saved = t.to_json()  # the decision file holds what was measured, and reads back as written
    assert trials.Trial.from_json(saved).to_json() == saved and saved["median_ms"].keys() <= {
        k for k, v in t.measured.items() if v
    }
    if together:  # all built before the rounds: the overrun is the builds' misprediction
        assert len(slow.built) == n and budget < t.built_s <= t.cost_s <= (n * 0.6 + 0.1) * budget
    else:  # in turn: the second is not built once the first's pace would overrun the budget
        assert len(slow.built) == 1 and t.cost_s <= 0.7 * budget


def test_the_rounds_are_recounted_from_what_the_builds_took(make_config, monkeypatch):
    def build(t):  # builds that leave the budget 2.5 rounds after the warm-up
        n, step_s = len(t.shortlist), 10.0 / 1e3
        return (t.budget_s - n * trials.WARMUP * step_s - 2.5 * n * t.steps * step_s) / n

    _, d, _ = _with_builds(make_config, monkeypatch, True, build)
    assert d.trial.rounds == 2 and all(len(v) == 2 for v in d.trial.measured.values())
    assert d.trial.cost_s <= d.trial.budget_s and d.trial.winner is not None


def test_off_measures_nothing_and_always_measures_a_short_run(make_config, monkeypatch):
    fixed_room(monkeypatch, device=2 * MiB)
    cfg = make_config(**BIG, placement_trial="off")
    data = build_data(cfg)
    times = FakeTimes(lambda c: 1.0 if c.placement == "host" else 2.0)
    d = predicted_planner(times).plan(cfg, data, CPU, write=False)
    assert not times.built and d.chosen.placement == "hotline" and d.trial.mode == "off"
    d = predicted_planner(times).plan(cfg.replace(placement_trial="always"), data, CPU, write=False)
    assert d.chosen == Candidate("host") and d.trial.rounds == trials.MIN_ROUNDS


def test_not_a_close_call_is_decided_by_prediction(make_config, monkeypatch):
    fixed_room(monkeypatch, device=2 * MiB)
    cfg = make_config(**BIG)

    def predict(cfg, candidate, sample):  # the fastest far ahead, and sure of it
        ms = 1.0 if candidate == Candidate("hotline", 6 * 1024) else 50.0
        return Prediction.of(StepTime(dense=ms), {"error": 0.1})

    times = FakeTimes(lambda c: 1.0)
    runner = TrialRunner(times.measurer, times.clock, share=100.0)
    d = Planner(predictor=predict, trials=runner).plan(cfg, build_data(cfg), CPU, write=False)
    assert d.chosen == Candidate("hotline", 6 * 1024) and not times.built
    assert d.trial.line.startswith("not a close call: the fastest predicted leads the next by")


def test_the_decision_with_its_measurements_round_trips(make_config, monkeypatch):
    fixed_room(monkeypatch, device=2 * MiB)
    cfg = make_config(**BIG)
    times = FakeTimes(lambda c: {"host": 2.5}.get(c.placement, 3.25))
    d = predicted_planner(times, share=100.0).plan(cfg, build_data(cfg), CPU, write=False)
    written = json.loads(json.dumps(d.to_json()))
    assert (
        written["trial"]["median_ms"]["host"] == pytest.approx(2.5)
        and written["trial"]["winner"] == "host"
    )
    back = Decision.from_json(written)
    assert back.to_json() == written and back.table() == d.table()
    # the planning's seconds per phase, each phase once, in order, within the whole
    phases = written["planning_phases_s"]
    assert list(phases) == ["inventory", "sample", "candidates", "prediction", "trial"]
    assert all(v >= 0 for v in phases.values())
    assert sum(phases.values()) <= written["planning_s"] + 0.01
    # a decision file from before the trial (and the phases) reads as one without them
    del written["trial"], written["planning_phases_s"]
    assert Decision.from_json(written).trial is None
    assert Decision.from_json(written).to_json() == written


# --- the run: bit-identical to the placement given by hand -----------------------------------------


class Forced:
    """The real measurer (each candidate's run built and stepped), with a clock that charges one
    second more per step to every candidate but `winner`: the trial picks it whatever the host
    measures, after running real steps of every candidate."""

    def __init__(self, winner: str) -> None:
        self.winner, self.extra, self.stepped = winner, 0.0, []

    def clock(self) -> float:
        import time

        return time.perf_counter() + self.extra

    def measurer(self, cfg, data, device):
        inner, c, forced = trial_contender(cfg, data, device), candidate_of(cfg), self

        class Charged:
            def step(self) -> None:
                inner.step()
                forced.stepped.append(c)
                forced.extra += 0.0 if c.placement == forced.winner else 1.0

            def wait(self) -> None:
                inner.wait()

            def close(self) -> None:
                inner.close()

        return Charged()


@pytest.mark.parametrize("winner", ["host", "hotline"])
def test_auto_with_a_trial_ends_bit_identical_to_its_choice_by_hand(
    make_config, monkeypatch, tmp_path, winner
):
    fixed_room(monkeypatch, device=2 * MiB)
    forced = Forced(winner)

    def predict(cfg, candidate, sample):
        return Prediction.of(StepTime(dense=fake_ms(candidate)))

    runner = TrialRunner(forced.measurer, forced.clock)
    monkeypatch.setattr(planner, "default_planner", lambda: Planner(predictor=predict,
                                                                   trials=runner))  # fmt: skip
    steps = dict(BIG, num_batches=6, placement_trial="always")
    auto = Trainer(make_config(**steps))
    run = Path(auto.cfg.out_dir)
    got = auto.fit()
    decision = json.loads((run / DECISION_NAME).read_text())
    assert decision["trial"]["winner"].split(",")[0] == winner == got["placement"]["kind"]
    assert len({c for c in forced.stepped}) == len(decision["trial"]["shortlist"]) >= 2
    chosen = decision["settings"]
    by_hand = Trainer(make_config(**{**steps, **chosen, "placement_trial": "auto"},
                                  out_dir=str(tmp_path / "by-hand")))  # fmt: skip
    want = by_hand.fit()
    assert_resumed_exactly(by_hand, auto, (want, got), ["test_auc", "test_logloss", "steps"])
    a, b = by_hand.dense_optimizer.state_dict(), auto.dense_optimizer.state_dict()
    assert a["state"].keys() == b["state"].keys()
    for k in a["state"]:
        for name, v in a["state"][k].items():
            assert (
                torch.equal(v, b["state"][k][name])
                if torch.is_tensor(v)
                else v == b["state"][k][name]
            )
    # the run directory holds the decision and the run's own files, none of the trial's
    assert not list(run.glob("placement-trial-*"))


@pytest.mark.gpu
def test_the_trial_measures_on_cuda(make_config, monkeypatch):
    fixed_room(monkeypatch, device=2 * MiB)
    cfg = make_config(**BIG, device="cuda", placement_trial="always")
    d = predicted_planner(None).plan(cfg, build_data(cfg), torch.device("cuda"), write=False)
    assert d.trial is None  # no runner: as predicted
    runner = TrialRunner(trial_contender)  # the run's measurer and the real clock, on the device
    p = Planner(predictor=predicted_planner(None).predictor, trials=runner)
    d = p.plan(cfg, build_data(cfg), torch.device("cuda"), write=False)
    t = d.trial
    assert t.rounds == trials.MIN_ROUNDS and len(t.shortlist) >= 2
    assert all(len(v) == t.rounds and min(v) > 0 for v in t.measured.values())
    assert d.chosen.label() == t.winner == min(t.shortlist, key=t.median)
    assert isinstance(Trial.from_json(json.loads(json.dumps(t.to_json()))), Trial)

"""`--placement auto` (dlrm/placement/auto.py): the candidates weighed against a fixed inventory and a
fake predictor given to the planner here, so every decision is exact; the decision file, its reuse on
resume, and the measured-against-predicted event of a run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dlrm.data import build_data
from dlrm.errors import ConfigError
from dlrm.placement import auto as planner
from dlrm.placement import candidates as planning
from dlrm.placement.auto import DECISION_NAME, plan, resolve_auto
from dlrm.placement.candidates import Prediction, StepTime
from dlrm.placement.kinds import kind_names
from dlrm.trainer import Trainer
from embeddings import SparseOptimizer
from embeddings.hot_rows import row_bytes
from embeddings.room import MemoryInventory, Room, fmt_bytes

GiB, MiB = 2**30, 2**20
CPU = torch.device("cpu")
# 305,070 rows of 4 floats (16 bytes with SGD): 4.7 MiB of tables
BIG = dict(arch_embedding_size=(200_000, 100_000, 5_000, 70), placement="auto", test_data_size=256)
BASE_MS = {"device": 1.0, "hotline": 6.0, "fae": 7.0, "tiered": 8.0, "host": 9.0}


def fake_ms(c) -> float:
    """Faster with more hot rows, and hotline before fae before tiered at equal budgets."""
    return BASE_MS[c.placement] - c.hot_budget / MiB + (0.0 if c.scm_cache else 0.001)


def use_predictor(monkeypatch, predict) -> None:
    """The planner of every run and `plan` call in the test predicts with `predict`."""
    monkeypatch.setattr(planner, "default_planner", lambda: planner.Planner(predictor=predict))


@pytest.fixture
def predicted(monkeypatch):
    calls = []

    def predict(cfg, candidate, sample):
        assert cfg.placement == candidate.placement and sample.profile is not None
        assert len(sample.batches) == len(sample.batch_indices) > 0
        calls.append(candidate)
        return Prediction.of(StepTime(dense=fake_ms(candidate)))

    use_predictor(monkeypatch, predict)
    return calls


@pytest.fixture
def no_predictor(monkeypatch):
    use_predictor(monkeypatch, None)


def fixed_room(monkeypatch, device: int | None, host: int = 8 * GiB, disk: int = 64 * GiB):
    """A CUDA-like inventory (a device tier apart from host DRAM) of these sizes."""
    room = MemoryInventory(
        None if device is None else Room(device, "fake device"),
        Room(host, "fake host"),
        Room(disk, "fake disk"),
    )
    monkeypatch.setattr(planner, "inventory", lambda *a, **k: room)


def decide(make_config, **kw):
    cfg = make_config(**{**BIG, **kw})
    return plan(cfg, build_data(cfg), CPU, write=False)


def test_the_fastest_predicted_candidate_that_fits_is_chosen(make_config, monkeypatch, predicted):
    fixed_room(monkeypatch, device=2 * MiB)
    d = decide(make_config)
    rows = {w.candidate: w for w in d.weighed}
    fitting = [w for w in d.weighed if w.prediction is not None]
    assert d.chosen == min(fitting, key=lambda w: w.prediction.ms_per_step).candidate
    assert d.chosen.placement == "hotline" and 0 < d.chosen.hot_budget < 2 * MiB
    # every faster candidate was rejected for the memory it lacks, and predicted never
    faster = [w for w in d.weighed if fake_ms(w.candidate) < fake_ms(d.chosen)]
    assert faster and all("CUDA memory short by" in w.rejected for w in faster)
    assert all(w.prediction is None for w in faster)
    assert rows[planning.Candidate("device")].rejected.startswith("CUDA memory short by")
    # every kind was weighed; only the fitting ones were predicted
    assert {w.candidate.placement for w in d.weighed} == set(kind_names())
    assert sorted(map(repr, predicted)) == sorted(repr(w.candidate) for w in fitting)
    assert "the fastest predicted" in d.how and "CHOSEN" in d.table()


def test_equal_predictions_go_to_the_candidate_that_needs_least_memory(make_config, monkeypatch):
    # tiered caches a run never fills read nothing whatever their size: predicted alike
    use_predictor(
        monkeypatch, lambda cfg, c, s: Prediction(5.0 if c.placement == "tiered" else 50.0)
    )
    fixed_room(monkeypatch, device=2 * MiB, host=3 * MiB)
    d = decide(make_config)
    tiered = [
        w for w in d.weighed if w.prediction is not None and w.candidate.placement == "tiered"
    ]
    assert len({w.candidate.scm_cache for w in tiered}) > 1
    least = min(tiered, key=lambda w: w.needs.on("device") + w.needs.on("host"))
    assert d.chosen == least.candidate


def test_margin_rejects_what_fits_only_without_it(make_config, monkeypatch, predicted):
    fixed_room(monkeypatch, device=GiB)
    need = decide(make_config).weighed[0].needs.on("device")  # device fits: nothing else weighed
    room = int(need / 0.9)  # fits, but not with 30% left free
    fixed_room(monkeypatch, device=room)
    d = decide(make_config)
    device = d.weighed[0]
    usable = int(room * (1 - planner.PLAN_MARGIN))
    assert device.rejected == f"CUDA memory short by {fmt_bytes(need - usable)}"
    assert d.chosen.placement != "device"
    cfg = make_config(**BIG)
    without = plan(cfg, build_data(cfg), CPU, write=False, margin=0.0)
    assert without.chosen == planning.Candidate("device") and len(predicted) == len(
        [w for w in d.weighed if w.prediction]
    )  # the device shortcut predicts nothing


def test_tiered_over_the_disk_is_rejected_with_the_tier_it_lacks(
    make_config, monkeypatch, predicted
):
    fixed_room(monkeypatch, device=2 * MiB, disk=MiB)
    d = decide(make_config)
    tiered = [w for w in d.weighed if w.candidate.placement == "tiered"]
    assert tiered and all(w.rejected.startswith("disk short by") for w in tiered)
    for w in tiered:
        assert w.rejected == f"disk short by {fmt_bytes(w.needs.on('disk') - MiB)}"


def test_without_a_predictor_the_preference_order_decides(make_config, monkeypatch, no_predictor):
    fixed_room(monkeypatch, device=2 * MiB)
    d = decide(make_config)
    fae = [w for w in d.weighed if w.candidate.placement == "fae" and w.fits]
    assert (
        d.chosen == max(fae, key=lambda w: w.candidate.hot_budget).candidate
    )  # fae before hotline
    assert d.how.startswith("no performance model: chosen by preference (device, fae, hotline")
    assert "no performance model: chosen by preference" in d.table().splitlines()[0]
    assert all(w.prediction is None for w in d.weighed)


def test_nothing_fits_is_one_line(make_config, monkeypatch, no_predictor):
    fixed_room(monkeypatch, device=MiB // 4, host=MiB, disk=MiB)
    with pytest.raises(ConfigError) as e:
        decide(make_config)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("--placement auto: no placement fits")
    assert "short by" in msg


def test_device_when_it_fits_writes_no_profile(make_config, tmp_path, predicted, capsys):
    t = Trainer(make_config(**BIG, data_size=64 * 4))
    summary = t.fit()
    run = Path(t.cfg.out_dir)
    assert not (run / "access_profile.npz").exists() and not predicted
    decision = json.loads((run / DECISION_NAME).read_text())
    assert decision["settings"] == {"placement": "device"}
    assert decision["how"] == "every table fits on the device: nothing to plan"
    assert summary["placement"]["requested"] == "auto" and summary["placement"]["kind"] == "device"
    out = capsys.readouterr().out
    assert "--placement auto: device (every table fits" in out


def _events(run: Path, kind: str) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


@pytest.mark.usefixtures("long_training")
def test_decision_is_written_measured_and_reused_on_resume(
    make_config, tmp_path, monkeypatch, predicted, capsys
):
    fixed_room(monkeypatch, device=2 * MiB)
    common = dict(BIG, data_size=64 * 10, nepochs=2, test_freq=10, keep_checkpoints=5)
    full = Trainer(make_config(**common))
    run = Path(full.cfg.out_dir)
    summary = full.fit()
    written = json.loads((run / DECISION_NAME).read_text())
    chosen = written["settings"]
    assert chosen["placement"] == "hotline" and summary["placement"]["kind"] == "hotline"
    assert (run / "access_profile.npz").is_file()
    (check,) = _events(run, "placement_check")  # measured against predicted, once
    predicted_ms = fake_ms(planning.Candidate("hotline", chosen["hot_budget"]))
    assert check["placement"] == f"hotline, hot {chosen['hot_budget'] // 1024}KiB"
    assert check["predicted_ms"] == pytest.approx(predicted_ms)
    assert check["steps_measured"] == 20 and check["measured_ms"] > 0
    assert "against" in capsys.readouterr().out
    # resumed at step 10 with a predictor that prefers another placement: the decision stays
    (run / "checkpoints" / "step_000000020.pt").unlink()
    (run / "summary.json").unlink()
    use_predictor(monkeypatch, lambda cfg, c, s: Prediction(-fake_ms(c)))
    resumed = Trainer(make_config(**common, resume="auto"))
    assert resumed.state.step == 10
    again = resumed.fit()
    assert again["placement"]["kind"] == "hotline" and again["test_auc"] == summary["test_auc"]
    assert json.loads((run / DECISION_NAME).read_text()) == written  # kept as it was
    assert f"reused from {run / DECISION_NAME} (--resume)" in capsys.readouterr().out


def test_several_processes_keep_their_rules(make_config, capsys):
    cfg = make_config(**BIG)
    out, decision = resolve_auto(cfg, build_data(cfg), CPU, world_size=2)
    assert out is cfg and decision is None
    line = capsys.readouterr().out.strip()
    assert line.startswith("--placement auto with 2 processes: no planning;") and "\n" not in line


@pytest.mark.usefixtures("long_training")
def test_tbsm_is_planned_and_trained(make_config, tmp_path, monkeypatch, predicted):
    from data_pipeline.taobao_synthetic import PlantedBehavior, write_user_behavior

    raw = tmp_path / "ub.csv"
    write_user_behavior(raw, PlantedBehavior(num_users=120, min_events=8, max_events=12, seed=2))
    cfg = make_config(
        model="tbsm", data_set="taobao", raw_data_file=str(raw), ts_length=4, mini_batch_size=32,
        arch_embedding_size=None, arch_sparse_feature_size=None, arch_mlp_bot=None,
        arch_mlp_top=None, optimizer="adagrad", placement="auto",
    )  # fmt: skip
    data = build_data(cfg)
    fixed_room(monkeypatch, device=GiB)
    need = plan(cfg, data, CPU, write=False).weighed[0].needs.on("device")  # fits
    tables = sum(data.table_sizes) * row_bytes(16, SparseOptimizer("adagrad"))
    # the device short of half the tables: the dense part fits, with every hot budget under half
    fixed_room(monkeypatch, device=int((need - tables // 2) / (1 - planner.PLAN_MARGIN)))
    t = Trainer(cfg)
    summary = t.fit()
    decision = json.loads((Path(cfg.out_dir) / DECISION_NAME).read_text())
    assert decision["settings"]["placement"] != "device"
    assert summary["placement"]["kind"] == decision["settings"]["placement"]
    assert predicted and summary["test_auc"] is not None


@pytest.mark.gpu
def test_auto_on_cuda_plans_with_device_memory(make_config, no_predictor):
    cfg = make_config(**BIG, device="cuda")
    d = plan(cfg, build_data(cfg), torch.device("cuda"), write=False)
    assert d.room["device"]["source"] == "free CUDA memory"
    assert d.chosen.placement == "device" and d.weighed[0].needs.on("device") > 0


def test_a_given_hot_budget_bounds_the_rows_on_the_device(make_config, no_predictor):
    """`--hot-budget` given: auto's rule of before (device when every table fits it, else fae by
    preference), hot budgets no larger than it."""
    d = decide(make_config, hot_budget="2MB")  # 4.7 MiB of tables, on a CPU with room for all
    assert d.weighed[0].rejected.startswith("--hot-budget short by ")
    assert d.chosen.placement == "fae" and d.chosen.hot_budget <= 2 * MiB
    assert all(w.candidate.hot_budget <= 2 * MiB for w in d.weighed)
    assert decide(make_config, hot_budget="8MB").chosen == planning.Candidate("device")


def test_the_planning_sample_takes_batches_the_profile_did_not_count(
    make_config, monkeypatch, predicted
):
    # a batch the profile counted has no cold row the profile missed: replaying one would make
    # the cold rows and the row cache's misses look fewer than training meets
    from dlrm.placement.run_plan import profiled_batches

    seen = []
    fn = planner.default_planner().predictor
    use_predictor(monkeypatch, lambda c, cand, s: seen.append(s) or fn(c, cand, s))
    fixed_room(monkeypatch, device=2 * MiB)
    cfg = make_config(**BIG, profile_sample_rate=0.25)
    plan(cfg, build_data(cfg), CPU, write=False)
    s = seen[0]
    counted = profiled_batches(s.batches_per_epoch, 0.25)
    assert s.batches_per_epoch >= 8 and len(s.batch_indices) == planner.SAMPLE_BATCHES
    assert not set(s.batch_indices) & set(counted)
    assert planner.counted_batches(s.batches_per_epoch, s.profile.sample_rate) == counted
    # the stream a cache that starts empty is replayed on: the run's first uncounted batches, in
    # order; the prediction's steps: the whole run
    first = [j for j in range(s.batches_per_epoch) if j not in counted][: planning.STREAM_BATCHES]
    stream = s.stream()
    assert len(stream) == len(first) and s.stream() is stream  # read once
    data = build_data(cfg)
    for j, kjt in zip(first, stream):
        assert torch.equal(kjt.values(), data.train.batch(0, j).sparse_features.values())
    assert s.steps == (0, s.batches_per_epoch * cfg.nepochs)
    # evenly spread over the rest; every batch counted: the sample is all there is
    assert planner.sample_batches(40, range(0, 40, 2)) == [1, 5, 11, 15, 21, 25, 31, 35]
    assert planner.sample_batches(4, range(4)) == [0, 1, 2, 3]


def test_the_check_composes_with_another_hook_and_reports_once():
    from contextlib import nullcontext

    from dlrm.pipelines.base import StepHook
    from dlrm.placement.auto_check import MeasuredAgainstPredicted

    class Counting(StepHook):
        steps, phases, attached = 0, [], None

        def attach(self, trainer):
            self.attached = trainer

        def step(self, batch, run):
            self.steps += 1
            return run()

        def phase(self, name):
            self.phases.append(name)
            return nullcontext()

    inner = Counting()
    hook = MeasuredAgainstPredicted("fae, hot 1MiB", 2.0, inner, steps=3)
    hook.attach(None)
    for i in range(5):
        with hook.phase("forward"):
            assert hook.step(None, lambda i=i: torch.tensor(float(i))) == i
    assert inner.steps == 5 and inner.phases == ["forward"] * 5
    r = hook.result
    assert r["steps_measured"] == 3 and r["predicted_ms"] == 2.0 and r["measured_ms"] >= 0
    assert r["relative_error"] == pytest.approx((r["measured_ms"] - 2.0) / 2.0, rel=1e-3)


@pytest.mark.usefixtures("long_training")
def test_a_run_from_before_the_planner_resumes_with_its_rule(make_config, no_predictor, capsys):
    common = dict(BIG, data_size=64 * 10, nepochs=2, test_freq=10, keep_checkpoints=5)
    first = Trainer(make_config(**common, hot_budget="1MB"))
    run = Path(first.cfg.out_dir)
    first.fit()
    (run / DECISION_NAME).unlink()  # as a run before the planner left it
    (run / "checkpoints" / "step_000000020.pt").unlink()
    (run / "summary.json").unlink()
    resumed = Trainer(make_config(**common, hot_budget="1MB", resume="auto"))
    assert resumed.state.step == 10
    assert resumed.fit()["placement"]["kind"] == "fae"  # 4.7 MiB of tables over --hot-budget
    decision = json.loads((run / DECISION_NAME).read_text())
    assert decision["how"].startswith("resumed a run from before the planner")
    assert decision["settings"] == {"placement": "fae", "hot_budget": MiB}


def test_the_table_names_what_predicted_and_how_to_fit_a_model(make_config, monkeypatch):
    """Predictions from peak figures (no fitted model on this machine) are labelled as such,
    with the two commands that fit one; a fitted model's are labelled without the hint."""
    fixed_room(monkeypatch, device=2 * MiB)
    for source, hint in (("roofline (no fitted model)", True), ("fitted model", False)):
        use_predictor(
            monkeypatch,
            lambda cfg, c, s, src=source: Prediction(fake_ms(c), detail={"source": src}),
        )
        lines = decide(make_config).table().splitlines()
        assert f"  predicted by: {source}" in lines
        assert any("python -m perfmodel fit --bench DIR" in line for line in lines) == hint

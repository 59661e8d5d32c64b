"""perfmodel/calibration.py: the performance model calibrated at a run's own shapes the first time
a prediction needs one, cached per machine, software stack and shape set.

One real calibration (tiny shapes, a budget of a hundredth of a second: the fewest measurements)
is made by `python -m perfmodel predict` on a fresh cache directory; the other tests fit their
model again from that calibration's measurements (`measure` replaced by its recording), so only
the cache's behaviour is what they exercise."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch

from dlrm.config import TrainConfig
from dlrm.train import build_parser
from perfmodel import calibration as C
from perfmodel import graph
from perfmodel import model as M
from perfmodel.__main__ import main

MiB = 2**20
TINY = ["--arch-embedding-size", "200000-100000-5000-70", "--arch-sparse-feature-size", "4",
        "--arch-mlp-bot", "13-16-4", "--arch-mlp-top", "16-1", "--mini-batch-size", "64",
        "--data-size", "1920", "--test-data-size", "256"]  # fmt: skip
SIZES = [200000, 100000, 5000, 70]


def config(*flags: str) -> TrainConfig:
    return TrainConfig(**vars(build_parser().parse_args([*TINY, *flags])))


def _quiet_machine_figures(mp) -> None:
    """The staging and disk figures are other modules' (cached per machine, measured in
    seconds): not what these tests are about."""
    mp.setattr(C, "_staging", lambda: "skipped")
    mp.setattr(C, "_disk", lambda cfg: "skipped")


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """`perfmodel predict` on a fresh cache directory with calibration on: its exit code,
    output, calibration file and the measurements it made."""
    cache = tmp_path_factory.mktemp("fresh-cache")
    made = []
    real = C.measure

    def recording(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HYBRID_DLRM_CACHE", str(cache))
        mp.setenv(C.ENV, "0.01")
        mp.setattr(C, "measure", recording)
        mp.setattr(C, "_MODELS", {})
        mp.setattr(M, "_LOADED", {})
        _quiet_machine_figures(mp)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(["predict", *TINY])
        path = C.calibration_path()
    return {"rc": rc, "out": out.getvalue(), "err": err.getvalue(), "path": path,
            "measured": made}  # fmt: skip


@pytest.fixture
def cache(tmp_path, monkeypatch, fresh):
    """A fresh cache directory, calibration on, `measure` giving the fresh run's measurements
    (counted in `calls`)."""
    calls = []

    def replay(cfg, sizes, seconds):
        calls.append(seconds)
        recs, docs, hw, counts = fresh["measured"][0]
        return [dict(r) for r in recs], docs, hw, dict(counts)

    monkeypatch.setenv("HYBRID_DLRM_CACHE", str(tmp_path))
    monkeypatch.setenv(C.ENV, "on")
    monkeypatch.setattr(C, "measure", replay)
    monkeypatch.setattr(C, "_MODELS", {})
    return calls


def test_predict_calibrates_on_a_fresh_cache_dir(fresh):
    """Before: `no performance model (run python -m perfmodel microbench and fit)`, exit 2."""
    assert fresh["rc"] == 0, fresh["err"]
    assert fresh["out"].startswith("predicted per-batch time: ")
    lines = [line for line in fresh["err"].splitlines() if "USDT" not in line]
    assert lines[0] == (
        "calibrating the performance model for this machine at the run's shapes (about 0 s; "
        f"once per machine, cached in {fresh['path']})"
    )
    assert lines[1].startswith("calibrated in ") and len(lines) == 2, lines
    doc = json.loads(fresh["path"].read_text())
    assert doc["format"] == C.FORMAT and len(doc["shape_sets"]) == 1


def test_a_tiny_budget_stops_at_the_fewest_measurements_and_still_gives_a_model(fresh):
    """Over budget from the start: one kept profiled step, every GEMM of the step timed once,
    the two extreme embedding draws; the model predicts."""
    recs, docs, hw, counts = fresh["measured"][0]
    assert counts["trace_steps"] == 1 and len(docs[0]["steps"]) == 1
    distinct = {
        json.dumps([r["name"], r["shapes"][:3], r["strides"][:3]])
        for r in graph.records_from_trace(docs[0])
        if r["name"] in ("aten::addmm", "aten::mm", "aten::bmm")
    }
    assert counts["gemms"] == len(distinct) == sum(r.get("sweep") == "gemm" for r in recs) > 0
    assert counts["embedding_draws"] == 2
    model = M.PerfModel.from_measurements(recs, docs, hw, gemm_mlp=False)
    assert model.predict_ops(graph.ops_with_ctx(docs[0], 0))["per_batch_us"] > 0


def test_table_scales_run_from_the_run_s_tables_down_past_the_caches():
    llc = 8 * MiB
    assert C.MAX_TABLE_BYTES == 128 * MiB
    scales = C._table_scales(1024 * MiB, llc)
    assert [s * 1024 * MiB for s in scales] == [128 * MiB, MiB, 64 * MiB, 8 * MiB]
    assert C._table_scales(MiB, llc) == [1.0, 1 / 16]  # all in the cache: a smaller one too


def test_zipf_ids_follow_the_law_the_hit_rate_assumes():
    """The share of ids on a table's most popular rows is the bounded power law's
    (`kernel_models.hit_rate` reads the same law), and every id is a row of the table."""
    from perfmodel.kernel_models import _rank_buckets

    rows, n = 1000, 200_000
    ids = C.zipf_ids(rows, 1.05, n, torch.Generator().manual_seed(0))
    assert int(ids.min()) >= 0 and int(ids.max()) < rows
    counts, probs = _rank_buckets(rows, 1.05, n_buckets=rows)
    top10 = float((counts * probs)[:10].sum())  # ranks 1-10: one row a bucket
    drawn = torch.bincount(ids, minlength=rows).sort(descending=True).values[:10].sum() / n
    assert abs(float(drawn) - top10) < 0.01, (float(drawn), top10)


def test_the_cache_round_trip_is_exact(cache, fresh):
    cfg = config()
    lines: list[str] = []
    first = C.model_for(cfg, SIZES, M.PerfModel, say=lines.append)
    assert len(cache) == 1 and lines[0].startswith("calibrating") and len(lines) == 2
    C._MODELS.clear()
    lines.clear()
    again = C.model_for(cfg, SIZES, M.PerfModel, say=lines.append)
    assert len(cache) == 1 and lines == []  # read, not measured
    assert again is not first and again.to_json() == first.to_json()
    ops = graph.ops_with_ctx(fresh["measured"][0][1][0], 0)
    assert again.predict_ops(ops) == first.predict_ops(ops)


@pytest.mark.parametrize(
    "content, line",
    [
        ("{not json", "{path}: not a readable calibration (JSONDecodeError); recalibrating"),
        (json.dumps({"format": "hybrid-perfmodel", "version": 1}),
         "{path}: not a hybrid-perfmodel-calibration file (format 'hybrid-perfmodel'); "
         "recalibrating"),
        (json.dumps({"format": C.FORMAT, "version": 1, "machine": "elsewhere", "stack": {},
                     "shape_sets": {}}),
         "{path}: calibrated on another machine; recalibrating"),
    ],
)  # fmt: skip
def test_a_corrupt_or_foreign_cache_is_one_line_and_recalibrates(cache, content, line):
    path = C.calibration_path()
    path.write_text(content)
    lines: list[str] = []
    C.model_for(config(), SIZES, M.PerfModel, say=lines.append)
    assert lines[0] == line.format(path=path)
    assert lines[1].startswith("calibrating") and len(lines) == 3 and len(cache) == 1
    assert len(json.loads(path.read_text())["shape_sets"]) == 1  # the file is whole again


def test_a_new_software_stack_recalibrates(cache, monkeypatch):
    C.model_for(config(), SIZES, M.PerfModel, say=lambda _line: None)
    C._MODELS.clear()
    real = C.stack_versions()
    monkeypatch.setattr(C, "stack_versions", lambda: dict(real, torch="9.9.9"))
    lines: list[str] = []
    C.model_for(config(), SIZES, M.PerfModel, say=lines.append)
    assert lines[0] == (
        f"{C.calibration_path()}: the software changed since calibration "
        f"(torch {torch.__version__} -> 9.9.9); recalibrating"
    )
    assert len(cache) == 2


def test_other_shapes_calibrate_their_own_and_keep_the_others(cache):
    C.model_for(config(), SIZES, M.PerfModel, say=lambda _line: None)
    C.model_for(
        config("--hot-budget", "1MB", "--placement", "fae"), SIZES, M.PerfModel, say=lambda _: None
    )
    assert len(cache) == 1  # a placement's settings are not shapes: the same calibration
    C.model_for(config("--mini-batch-size", "128"), SIZES, M.PerfModel, say=lambda _line: None)
    assert len(cache) == 2
    assert len(C.read_cache()["shape_sets"]) == 2


def test_load_model_prefers_a_fitted_model_and_never_calibrates_when_off(cache, monkeypatch):
    monkeypatch.setenv(C.ENV, "off")
    with pytest.raises(M.CalibrationOff):
        M.load_model(cfg=config(), table_sizes=SIZES)
    assert cache == []


def test_the_calibrated_predictor_tells_host_and_fae_apart(cache, monkeypatch):
    """The README's `--placement auto --hot-budget 8MB` case at tiny shapes: the planner's
    predictor (perfmodel/placement_costs.py) calibrates, and host and FAE get their own step
    times; with the roofline (no fitted model) both were the same number."""
    from perfmodel import placement_costs as pc

    cfg = config("--placement", "auto", "--hot-budget", "1MB")
    host, fae = pc.step_time(cfg, SIZES, "host"), pc.step_time(cfg, SIZES, "fae")
    assert len(cache) == 1 and host["source"] == fae["source"] == "fitted model"
    assert fae["hot_share"] > 0 and host["ms"] != fae["ms"], (host, fae)


def test_an_fae_capture_of_a_short_run_reads_the_planners_profile(cache, monkeypatch, tmp_path):
    """`--placement auto --num-batches 8`: the FAE capture looked for both kinds of batch in the
    run's 8 (StopIteration: "no prediction"), and profiled the epoch again at batch 16 (6 s
    per FAE candidate on the README's tables). Now it steps through the epoch and plans its hot
    set from the profile the planner wrote in the run directory."""
    from types import SimpleNamespace

    from dlrm.data import build_data
    from dlrm.placement import run_plan
    from perfmodel import placement_costs as pc

    cfg = config("--placement", "auto", "--hot-budget", "1MB", "--num-batches", "2",
                 "--out-dir", str(tmp_path / "run"))  # fmt: skip
    cfg.run_dir.mkdir(parents=True)
    data = build_data(cfg)
    names = data.feature_names
    profile = run_plan.obtain_profile(cfg.placing, cfg.run_dir, names, SIZES, data.train)
    assert (cfg.run_dir / run_plan.PROFILE_NAME).is_file()
    profiled = []
    real = run_plan.profile_training_sample
    monkeypatch.setattr(run_plan, "profile_training_sample",
                        lambda *a, **k: profiled.append(1) or real(*a, **k))  # fmt: skip
    sample = SimpleNamespace(profile=profile, memo=None)
    fae = pc.PlacementCosts().captured(cfg, sample, "fae")
    assert fae.detail["source"] == "fitted model" and fae.detail["hot_input_share"] > 0
    assert profiled == []  # the planner's profile, not a new one


@pytest.mark.gpu
def test_calibrates_on_cuda(tmp_path, monkeypatch):
    """Nothing CUDA-specific: the run's step, its GEMMs and the lookups are measured on the
    config's device (CUDA events and synchronisation where it is one)."""
    monkeypatch.setenv("HYBRID_DLRM_CACHE", str(tmp_path))
    _quiet_machine_figures(monkeypatch)
    cfg = config("--device", "cuda")
    recs, docs, hw, counts = C.measure(cfg, SIZES, 5.0)
    assert counts["trace_steps"] >= 1 and counts["gemms"] > 0 and counts["embedding_draws"] >= 2
    assert all(r["stream"].startswith("cuda") for r in recs if r.get("sweep") == "gemm")
    model = M.PerfModel.from_measurements(recs, docs, hw, gemm_mlp=False)
    assert model.predict_ops(graph.ops_with_ctx(docs[0], 0))["per_batch_us"] > 0

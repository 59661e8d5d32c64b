"""The placement planner's predictions (perfmodel/placement_costs.py): what they count is checked
against the real code (the SSD tier's cache, a direct count of cold rows), and they move the
right way with the budgets. No timings are asserted."""

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from data_pipeline.synthetic import PlantedWorld, SyntheticBatchSource, SyntheticConfig
from dlrm.config import TrainConfig
from dlrm.placement.candidates import Candidate, PlanMemo
from embeddings.config import SparseOptimizer, TableSpec
from embeddings.profile import AccessProfiler
from embeddings.row_layout import table_row_base
from embeddings.ssd.collection import profile_priority
from embeddings.ssd.file import PAYLOAD
from embeddings.ssd.tier import ScmTier
from perfmodel import disk
from perfmodel import placement_costs as pc
from perfmodel import row_cache_model as rcm

ROOT = Path(__file__).resolve().parents[2]
SIZES = [300, 2000, 50, 5000]
DIM = 8
B = 64


@pytest.fixture(scope="module")
def sample():
    world = PlantedWorld(SyntheticConfig(table_sizes=SIZES, zipf_alpha=1.05, seed=3))
    src = SyntheticBatchSource(world, "train", B, 40)
    names = [f"cat_{i}" for i in range(len(SIZES))]
    prof = AccessProfiler(SIZES, names)
    for j in range(0, 40, 2):  # the profile: even batches; the replay: odd ones (out of sample)
        prof.add_kjt(src.batch(0, j).sparse_features)
    batches = [src.batch(0, j).sparse_features for j in range(1, 40, 2)]
    return SimpleNamespace(profile=prof.finish(), batches=batches, steps=(0, 200),
                           stream=lambda: batches, memo=PlanMemo())  # fmt: skip


def config(**kw):
    base = {"arch_embedding_size": "-".join(map(str, SIZES)), "arch_sparse_feature_size": DIM,
            "mini_batch_size": B, "optimizer": "sgd", "learning_rate": 0.1,
            "arch_mlp_bot": "13-8", "arch_mlp_top": "8-1"}  # fmt: skip
    base.update(kw)
    return TrainConfig.from_json(base)


@pytest.fixture
def stubbed(monkeypatch):
    """The step, the machine's row costs and the disk fixed: predictions without measuring."""
    step = {"ms": 5.0, "dense": 4.0, "lookup": 1.0, "source": "stub"}
    monkeypatch.setattr(
        pc, "step_time", lambda cfg, sizes, placement="device", table_sizes=None, memo=None: step
    )
    figs = {"gather_ns_16": 50.0, "gather_ns_128": 200.0, "scatter_ns_16": 60.0,
            "scatter_ns_128": 250.0, "hash_ns_per_row": 30.0, "crc_us_per_block": 1.0,
            "load_ns_16": 150.0, "load_ns_128": 700.0, "load_fixed_ns_16": 8e5,
            "load_fixed_ns_128": 1.1e6}  # fmt: skip
    monkeypatch.setattr(pc, "staging_figures", lambda: figs)
    d = {"io": "direct", "engine": "aio", "key": "stub",
         "depths": {"1": {"iops": 5000, "latency_us": 200}, "64": {"iops": 50000, "latency_us": 1300}}}  # fmt: skip
    monkeypatch.setattr(disk, "describe_disk", lambda directory=None, refresh=False: d)


def test_counted_cold_rows_equal_a_direct_count(sample):
    cfg = config()
    plan = pc.hot_plan(sample, 20 * DIM * 4 * 8, DIM, cfg.training.sparse_optimizer())
    base = table_row_base(SIZES).numpy()
    held = [plan.tier("device").held_ids(t) for t in range(len(SIZES))]
    got = pc.cold_batches(sample.batches, plan)
    assert len(got) == len(sample.batches)
    for kjt, cb in zip(sample.batches, got):
        per = np.split(kjt.values().numpy(), np.cumsum(kjt.length_per_key())[:-1])
        cold = [ids[~np.isin(ids, held[t])] for t, ids in enumerate(per)]
        want = np.concatenate([np.unique(c) + base[t] for t, c in enumerate(cold)])
        assert np.array_equal(cb.cold.numpy(), np.sort(want))
        assert cb.cold_per_table == [int(np.unique(c).size) for c in cold]
        assert cb.cold_lookups == sum(c.size for c in cold)
        assert cb.lookups == kjt.values().numel()


@pytest.mark.parametrize("layout", ["identity", "profile"])
@pytest.mark.parametrize("cache_rows", [0, 40, 400])
def test_replayed_hit_rate_equals_the_real_tier_on_the_same_accesses(
    tmp_path, sample, cache_rows, layout
):
    """The SSD tier itself (ScmTier with its RowCache, files and all) fed the replay's sequence:
    warm-up reads, each batch's cold rows read, written back WRITEBACK_LAG stagings later; the
    blocks it reads counted through the file's layout as the replay counts them."""
    from embeddings.ssd.layout import plan_layout

    cfg = config()
    opt = SparseOptimizer("sgd", 0.1)
    plan = pc.hot_plan(sample, 10 * DIM * 4, DIM, cfg.training.sparse_optimizer())
    cold = [b.cold for b in pc.cold_batches(sample.batches, plan)]
    prio = profile_priority(sample.profile.counts, SIZES)
    ranked, _ = rcm.seen_rows(sample.profile.counts, SIZES)
    warm = rcm.warm_rows(ranked, pc.hot_row_map(plan), cache_rows, 50)
    rpb = PAYLOAD // (4 * DIM)
    laid = plan_layout(sample.profile, plan) if layout == "profile" else None
    assert laid is None or laid.num_placed > 0
    rep = rcm.replay_row_cache(cold, sum(SIZES), cache_rows, rpb, prio, warm=warm, layout=laid)

    tables = [TableSpec(f"t{i}", n, DIM, f"cat_{i}") for i, n in enumerate(SIZES)]
    tier = ScmTier(tmp_path / "scm", tables, opt, 0, cache_rows * 4 * DIM, io="buffered",
                   priority=prio, owner=str(tmp_path / "run"), layout=laid)  # fmt: skip
    tier.queue_writes = False
    for ids in warm:
        tier.read_rows(ids)
    tier.cache.hits = tier.cache.misses = tier.cache.evictions = 0
    pending = []
    for ids in cold:
        weights, _ = tier.read_rows(ids)
        pending.append((ids, weights))
        if len(pending) > rcm.WRITEBACK_LAG:
            old, w = pending.pop(0)
            tier.write_rows(old, w + 1.0, None)
    assert (rep.hits, rep.misses, rep.evictions) == (
        tier.cache.hits, tier.cache.misses, tier.cache.evictions,
    )  # fmt: skip
    assert sum(rep.read_blocks) == tier.counts["blocks_read"]  # misses on blocks written
    assert rep.written_blocks == int(tier.materialised.sum())
    assert rep.misses > 0
    if cache_rows:
        assert rep.hits > 0
    tier.close()


def test_a_bigger_cache_never_predicts_more_misses(sample, stubbed):
    cfg = config(placement="tiered")
    budget = 10 * DIM * 4
    rows_bytes = 4 * DIM
    out = [pc.predict_candidate(cfg, Candidate("tiered", budget, n * rows_bytes), sample)
           for n in (0, 20, 100, 400, 2000, 8000)]  # fmt: skip
    reads = [p.detail["reads_per_step"] for p in out]
    hits = [p.detail["hit_rate"] for p in out]
    assert reads == sorted(reads, reverse=True) and reads[0] > reads[-1]
    assert hits == sorted(hits) and hits[0] == 0.0 and hits[-1] > 0.5
    for p in out:  # the parts add up to the prediction
        assert p.ms_per_step == pytest.approx(p.parts.total())


@pytest.mark.parametrize("kind", ["hotline", "tiered"])
def test_a_bigger_hot_budget_never_stages_more_rows(sample, stubbed, kind):
    cfg = config(placement=kind)
    rows = []
    for n in (0, 5, 50, 300, 3000):
        p = pc.predict_candidate(cfg, Candidate(kind, n * DIM * 4, 100 * DIM * 4), sample)
        rows.append(p.detail["cold_rows_per_batch"])
        assert p.detail["gather_bytes_per_batch"] == rows[-1] * DIM * 4
    assert rows == sorted(rows, reverse=True) and rows[0] > rows[-1]


@pytest.mark.parametrize("kind", ["hotline", "tiered"])
def test_the_step_threads_part_is_the_measured_line_over_the_cold_rows(sample, stubbed, kind):
    # measure_step_load's fixed cost per step plus its cost per row (8 floats: SGD at DIM 8,
    # extrapolated down from 16), and for tiered the queued write-back's hash of each row
    per_row = (150.0 + (700.0 - 150.0) * (DIM - 16) / 112) / 1e3
    fixed = (8e5 + (1.1e6 - 8e5) * (DIM - 16) / 112) / 1e3
    for n in (0, 50, 3000):
        p = pc.predict_candidate(config(placement=kind), Candidate(kind, n * DIM * 4, 40 * DIM * 4),
                                 sample)  # fmt: skip
        rows = p.detail["cold_rows_per_batch"]
        home = rows * 30.0 / 1e6 if kind == "tiered" else 0.0
        assert p.parts.load == pytest.approx((fixed + rows * per_row) / 1e3 + home)
    assert rows < p.detail["lookups_per_batch"]


def test_prefetch_hides_staging_only_with_a_worker(sample, stubbed, monkeypatch):
    monkeypatch.setattr(pc, "_spare_core", lambda: True)
    c = Candidate("hotline", 5 * DIM * 4)
    on = pc.predict_candidate(config(placement="hotline", hotline_prefetch=1), c, sample)
    off = pc.predict_candidate(config(placement="hotline", hotline_prefetch=0), c, sample)
    assert off.parts.hidden == 0.0 and on.parts.hidden < 0.0
    assert on.ms_per_step < off.ms_per_step
    monkeypatch.setattr(pc, "_spare_core", lambda: False)
    busy = pc.predict_candidate(config(placement="hotline", hotline_prefetch=1), c, sample)
    assert busy.parts.hidden == 0.0


def test_disk_figures_are_measured_once_then_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRID_DLRM_CACHE", str(tmp_path / "cache"))
    calls = []
    real = disk.measure

    def quick(directory, seconds_per_depth=0.0, seed=0):
        calls.append(directory)
        return real(directory, seconds_per_depth=0.01, seed=seed)

    monkeypatch.setattr(disk, "measure", quick)
    first = disk.describe_disk(tmp_path / "scm")
    again = disk.describe_disk(tmp_path / "scm")
    assert len(calls) == 1 and again == first
    assert disk.default_path(tmp_path / "scm").is_file()
    assert set(first["depths"]) == {str(d) for d in disk.DEPTHS}
    assert all(f["iops"] > 0 for f in first["depths"].values())
    assert not (tmp_path / "scm").exists()  # measured beside it, nothing left there or made
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]
    disk.describe_disk(tmp_path / "scm", refresh=True)
    assert len(calls) == 2
    t = [disk.read_seconds(first, n) for n in (0, 1, 10, 100, 1000)]
    assert t[0] == 0.0 and t[1:] == sorted(t[1:])


def test_read_time_grows_with_the_reads_even_from_a_noisy_measurement():
    noisy = {"depths": {"1": {"iops": 5000, "latency_us": 200}, "4": {"iops": 20000, "latency_us": 200},
                        "16": {"iops": 1000, "latency_us": 16000}, "64": {"iops": 60000, "latency_us": 1000}}}  # fmt: skip
    t = [disk.read_seconds(noisy, n) for n in range(1, 200)]
    assert t == sorted(t)
    assert disk.read_seconds(noisy, 1000) == 1000 / 60000  # past the depth: the deepest IOPS


def test_the_planner_finds_the_plugins_step_costs_without_an_import_side_effect():
    """Importing the plugin registers no predictor anywhere: the planner looks the step costs'
    factory up when a plan starts, and each lookup makes a fresh one (nothing shared)."""
    code = ("import sys; from dlrm.placement import candidates as planning; "
            "f = planning.default_costs(); a, b = f(), f(); assert a is not b; "
            "print(f.__module__, f.__name__, hasattr(planning, 'register_predictor'))")  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT), HYBRID_DLRM_PLUGINS="perfmodel.recorder")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=ROOT, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["perfmodel.placement_costs", "PlacementCosts", "False"]


def test_staged_candidates_share_one_captured_device_step(monkeypatch, tmp_path):
    # a device step runs the same operators whatever the hot budget or row cache: one capture
    # serves every staged candidate of the same tables (a capture is about a second)
    from perfmodel import graph

    keys = []

    def fake_graph_for(cfg, batch_size=None):
        keys.append(graph.graph_key(cfg))
        return {"step": (1.0, [])}, {}

    class Model:
        def predict_ops(self, ops):
            return {"per_batch_us": 1000.0, "breakdown": {"phase_us": {}}}

    monkeypatch.setattr(pc, "_fitted_model", lambda *args: Model())
    monkeypatch.setattr(graph, "graph_for", fake_graph_for)
    memo = PlanMemo()  # one plan's
    for hot, cache in ((10, 100), (50, 100), (50, 4000)):
        cfg = config(placement="tiered", hot_budget=hot * DIM * 4, scm_cache=cache * DIM * 4,
                     scm_dir=str(tmp_path / f"scm{hot}-{cache}"))  # fmt: skip
        assert pc.step_time(cfg, SIZES, "device", [7, 8, 9, 10], memo=memo)["ms"] == 1.0
    assert len(keys) == 1
    pc.step_time(config(placement="fae", hot_budget=10 * DIM * 4), SIZES, "fae", memo=memo)
    assert len(keys) == 2  # FAE's step depends on its hot budget: captured for it
    pc.step_time(cfg, SIZES, "device", [7, 8, 9, 10], memo=PlanMemo())
    assert len(keys) == 3  # another plan captures its own: nothing outlives a plan


def test_a_tiered_run_is_predicted_over_its_steps_and_checked_over_its_first(
    sample, stubbed, monkeypatch
):
    """The cache starts empty: a longer run's mean differs from its first steps', which the
    placement check measures (`checked_ms`, what Decision.checked_ms hands it)."""
    from dlrm.placement.auto_check import MEASURE_STEPS

    monkeypatch.setattr(pc, "_spare_core", lambda: False)  # the disk's time not hidden
    from dlrm.placement.auto import Decision
    from dlrm.placement.candidates import Candidate as C

    c = C("tiered", 10 * DIM * 4, 400 * DIM * 4)
    cfg = config(placement="tiered")
    short = pc.predict_candidate(cfg, c, SimpleNamespace(**{**vars(sample), "steps": (0, 150)}))
    assert "checked_ms" not in short.detail  # the check measures every step of it
    long = pc.predict_candidate(cfg, c, SimpleNamespace(**{**vars(sample), "steps": (0, 10**5)}))
    assert long.detail["checked_steps"] == [0, MEASURE_STEPS]
    assert long.detail["checked_ms"] != pytest.approx(long.ms_per_step)
    assert long.detail["hit_rate"] > short.detail["hit_rate"]
    # the checked figure is the run of the checked steps' own prediction
    first = pc.predict_candidate(
        cfg, c, SimpleNamespace(**{**vars(sample), "steps": (0, MEASURE_STEPS)})
    )
    assert long.detail["checked_ms"] == pytest.approx(first.ms_per_step)
    weighed = SimpleNamespace(candidate=c, prediction=long)
    d = Decision(c, "test", [weighed], {}, 0.3)
    assert d.checked_ms() == long.detail["checked_ms"] and d.predicted_ms() == long.ms_per_step


def test_a_criteo_data_set_too_large_to_build_is_captured_as_synthetic_tables_of_its_sizes():
    sizes = [10_000_000] * 26
    tb = TrainConfig.from_json({"data_set": "terabyte", "raw_data_file": "/nonexistent/day",
                                "processed_data_file": "/nonexistent/processed",
                                "arch_sparse_feature_size": 64, "mini_batch_size": 2048,
                                "arch_mlp_bot": "13-512-256-64", "arch_mlp_top": "512-512-256-1"})  # fmt: skip
    proxy = pc._capturable(tb, sizes)
    assert proxy.data_set == "synthetic" and not proxy.raw_data_file
    assert (
        len(proxy.arch_embedding_size) == 26 and sum(proxy.arch_embedding_size) <= pc.CAPTURE_ROWS
    )
    assert list(proxy.arch_embedding_size) == [pc.CAPTURE_ROWS // 26] * 26
    for field in ("arch_sparse_feature_size", "arch_mlp_bot", "arch_mlp_top", "mini_batch_size",
                  "optimizer", "precision", "arch_interaction_op"):  # fmt: skip
        assert getattr(proxy, field) == getattr(tb, field)
    assert pc._capturable(tb, [1000] * 26) is tb  # small enough to build as it is
    taobao = TrainConfig.from_json(
        {"model": "tbsm", "data_set": "taobao", "raw_data_file": "/nonexistent/taobao.txt"}
    )
    assert pc._capturable(taobao, [10_000_000] * 3) is None  # no stand-in: the roofline


def test_a_tiered_runs_disk_bursts_are_hidden_step_by_step(sample, stubbed, monkeypatch):
    """Before its cache is full a fresh tier reads nothing, after it every step reads: a step
    hides at most its own staging, so less is hidden than the mean staging would."""
    monkeypatch.setattr(pc, "_spare_core", lambda: True)
    slow = {"io": "direct", "engine": "aio", "key": "slow",
            "depths": {"1": {"iops": 200, "latency_us": 5000}, "64": {"iops": 400, "latency_us": 9e4}}}  # fmt: skip
    monkeypatch.setattr(disk, "describe_disk", lambda directory=None, refresh=False: slow)
    c = Candidate("tiered", 10 * DIM * 4, 100 * DIM * 4)
    p = pc.predict_candidate(config(placement="tiered"), c, sample)
    compute = p.parts.dense + p.parts.lookup + p.parts.load
    assert p.detail["cache_full_at_step"] is not None and p.detail["staging_ms"] > compute
    assert 0 < p.detail["hidden_ms"] < compute  # the steps before the cache filled hid little
    assert p.ms_per_step == pytest.approx(p.parts.total())

import json
import zipfile

import numpy as np
import pytest
import torch

from embeddings import SparseOptimizer
from embeddings.hot_inputs import AllHotClassifier
from embeddings.hot_rows import (
    PlacementError,
    PlacementPlan,
    TierPlan,
    parse_bytes,
    plan_placement,
    remap_dtype,
    row_bytes,
)
from embeddings.profile import AccessProfile, AccessProfiler

SGD = SparseOptimizer("sgd")


def hot_input_mask(plan, lengths, values):
    """The plan's all-hot mask of jagged numpy inputs (lengths [T, n], table-major values)."""
    mask = AllHotClassifier(plan).mask(
        torch.from_numpy(np.asarray(values, np.int64)),
        torch.from_numpy(np.asarray(lengths).reshape(-1)),
        lengths.shape[1],
    )
    return mask.numpy()


def profile_from_counts(counts, names=None):
    names = names or [f"f{i}" for i in range(len(counts))]
    return AccessProfile(
        names, [len(c) for c in counts], [np.asarray(c, np.int64) for c in counts], inputs=1
    )


def reference_hot_set(counts, budget_rows):
    """Brute force: seen rows ordered by (count desc, table, row), first budget_rows of them."""
    cands = [(-c, t, r) for t, cs in enumerate(counts) for r, c in enumerate(cs) if c > 0]
    return {(t, r) for _, t, r in sorted(cands)[:budget_rows]}


def test_hot_rows_are_the_most_looked_up_with_deterministic_ties():
    rng = np.random.default_rng(0)
    counts = [rng.integers(0, 6, n) for n in (40, 9, 120)]  # many ties, hottest rows anywhere
    dim = 4
    for budget_rows in (0, 1, 17, 60, 10_000):
        plan = plan_placement(
            profile_from_counts(counts), [dim] * 3, SGD, budget_rows * row_bytes(dim, SGD)
        )
        got = {(t, int(r)) for t, rm in enumerate(plan.remaps) for r in np.flatnonzero(rm >= 0)}
        assert got == reference_hot_set(counts, budget_rows)
        again = plan_placement(
            profile_from_counts(counts), [dim] * 3, SGD, budget_rows * row_bytes(dim, SGD)
        )
        for a, b in zip(plan.remaps, again.remaps):
            assert np.array_equal(a, b)


def test_remap_is_integer_concatenated_and_never_seen_rows_stay_cold():
    counts = [[0, 3, 0, 1], [5, 0, 0], [0, 0, 2]]
    plan = plan_placement(
        profile_from_counts(counts), [2, 2, 2], SGD, 10**9
    )  # budget for everything
    assert all(r.dtype.kind == "i" for r in plan.remaps)
    assert [r.tolist() for r in plan.remaps] == [[-1, 0, -1, 1], [2, -1, -1], [-1, -1, 3]]
    assert plan.hot_rows == [2, 1, 1] and plan.hot_offsets == [0, 2, 3] and plan.num_hot == 4
    t, r = plan.hot_ids()
    assert t.tolist() == [0, 0, 1, 2] and r.tolist() == [1, 3, 0, 2]
    assert remap_dtype(2**31 - 2) == np.int32 and remap_dtype(2**31) == np.int64


def test_budget_counts_optimizer_state():
    counts = [np.arange(1, 101)]
    budget = 40 * 8 * 4  # 40 rows of dim 8 without state
    sizes = {}
    for kind in ("sgd", "rowwise_adagrad", "adagrad"):
        opt = SparseOptimizer(kind)
        plan = plan_placement(profile_from_counts(counts), [8], opt, budget)
        sizes[kind] = plan.num_hot
        assert plan.device_bytes() <= budget
    assert sizes == {"sgd": 40, "rowwise_adagrad": 35, "adagrad": 20}  # 32, 36, 64 bytes a row
    # the hottest rows (the highest counts) are chosen
    plan = plan_placement(profile_from_counts(counts), [8], SGD, budget)
    assert np.flatnonzero(plan.remaps[0] >= 0).tolist() == list(range(60, 100))


def test_host_budget_and_size_parsing():
    with pytest.raises(PlacementError, match="host tier needs 48 bytes"):
        plan_placement(profile_from_counts([[1, 1, 1]]), [4], SGD, 100, host_budget=47)
    assert parse_bytes("256MB") == 256 * 2**20
    assert parse_bytes("1.5G") == 3 * 2**29
    assert (
        parse_bytes("64KiB") == 65536
        and parse_bytes("1048576") == 1048576
        and parse_bytes("2 gb") == 2**31
    )
    for bad in ("lots", "-5MB", "12XB", ""):
        with pytest.raises(PlacementError, match="--hot-budget: expected a size like 256MB"):
            parse_bytes(bad)


def test_report_measures_hot_lookups_and_all_hot_inputs_on_the_sample():
    prof = AccessProfiler([5, 4], ["a", "b"])
    rows = np.array([[0, 0], [0, 1], [1, 0], [4, 3], [0, 0], [0, 0]])
    prof.add_rows(rows)
    p = prof.finish()
    plan = plan_placement(p, [4, 4], SGD, 2 * row_bytes(4, SGD))  # hot: a0 (4), b0 (4)
    assert plan.hot_rows == [1, 1]
    assert plan.report["hot_lookup_share"] == pytest.approx(8 / 12)
    assert plan.report["hot_input_share"] == pytest.approx(3 / 6)  # inputs 0, 4, 5
    # jagged inputs: an empty bag is hot; one cold lookup makes the input cold
    lengths = np.array([[2, 0, 1], [1, 1, 0]])
    values = np.array([0, 0, 1, 0, 2])  # a: [0,0] [] [1] | b: [0] [2] []
    assert hot_input_mask(plan, lengths, values).tolist() == [True, False, False]


@pytest.mark.parametrize("one_home", [False, True])
@pytest.mark.parametrize("sparse", [None, True])
def test_a_plan_without_its_report_is_the_same_plan(one_home, sparse):
    """`report=False` (the planner's, one plan per candidate budget) skips the report's pass over
    the kept inputs and nothing else: the same tiers, rows and maps, an empty report."""
    prof = AccessProfiler([30, 4, 70], ["a", "b", "c"])
    rng = np.random.default_rng(5)
    prof.add_rows(np.stack([rng.integers(0, n, 50) for n in (30, 4, 70)], 1))
    p = prof.finish()
    opt = SparseOptimizer("rowwise_adagrad")
    args = (p, [4, 4, 4], opt, 25 * row_bytes(4, opt))
    full = plan_placement(*args, one_home=one_home, sparse=sparse)
    bare = plan_placement(*args, one_home=one_home, sparse=sparse, report=False)
    assert full.report and bare.report == {}
    bare.report = full.report
    assert_same_plan(bare, full)
    assert [bare.tier("device").held_count(t) for t in range(3)] == full.hot_rows
    assert all(np.array_equal(a, b) for a, b in zip(bare.hot_ids(), full.hot_ids()))


def test_plan_files_round_trip_and_bad_plans_are_refused(tmp_path):
    counts = [np.array([3, 0, 2, 7]), np.array([1, 1])]
    plan = plan_placement(
        profile_from_counts(counts), [4, 4], SparseOptimizer("rowwise_adagrad"), 10_000
    )
    path = plan.save(tmp_path / "plan")
    assert path.suffix == ".npz"
    meta = json.loads((tmp_path / "plan.json").read_text())
    assert (
        meta["hot_rows"] == [3, 2]
        and meta["optimizer"] == "rowwise_adagrad"
        and meta["bytes_per_row"] == [20, 20]
    )
    back = PlacementPlan.load(tmp_path / "plan.json")  # either name works
    for a, b in zip(plan.remaps, back.remaps):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert back.report == json.loads(json.dumps(plan.report))
    with pytest.raises(
        PlacementError, match="made for optimizer rowwise_adagrad, the model uses sgd"
    ):
        back.check_fits(["f0", "f1"], [4, 2], [4, 4], "sgd", "plan")
    with pytest.raises(PlacementError, match="table 1: 2 rows in the plan, 3 in the model"):
        back.check_fits(["f0", "f1"], [4, 3], [4, 4], "rowwise_adagrad", "plan")
    # a float remap (the original FAE bug) is refused, in either file version
    v1 = v1_meta(plan)
    for name, meta, prefix in [("float2", plan.meta(), "device_"), ("float1", v1, "")]:
        np.savez(tmp_path / f"{name}.npz", meta=np.array(json.dumps(meta)),
                 **{f"{prefix}remap_0": plan.remaps[0].astype(np.float32), f"{prefix}remap_1": plan.remaps[1]})  # fmt: skip
        with pytest.raises(
            PlacementError, match="remap of table 0 is float32, expected signed integers"
        ):
            PlacementPlan.load(tmp_path / f"{name}.npz")
    broken = [plan.remaps[0].copy(), plan.remaps[1]]
    broken[0][1] = 0  # two rows on hot entry 0
    np.savez(
        tmp_path / "dup.npz",
        meta=np.array(json.dumps(plan.meta())),
        device_remap_0=broken[0],
        device_remap_1=broken[1],
    )
    with pytest.raises(PlacementError, match="exactly once"):
        PlacementPlan.load(tmp_path / "dup.npz")


def v1_meta(plan):
    """The metadata version 1 of the planner wrote (a device remap; the host holds every row)."""
    return {
        "format": "hybrid-dlrm/placement-plan", "version": 1, "feature_names": plan.feature_names,
        "table_sizes": plan.table_sizes, "dims": plan.dims, "optimizer": plan.optimizer,
        "device_budget": plan.device_budget, "host_budget": plan.host_budget,
        "hot_rows": plan.hot_rows, "hot_offsets": plan.hot_offsets,
        "bytes_per_row": plan.bytes_per_row(), "device_bytes": plan.device_bytes(),
        "host_bytes": plan.host_bytes(), "report": plan.report,
    }  # fmt: skip


def assert_same_plan(a, b):
    assert (a.feature_names, a.table_sizes, a.dims, a.optimizer, a.replicated) == (
        b.feature_names, b.table_sizes, b.dims, b.optimizer, b.replicated,
    )  # fmt: skip
    assert [(t.name, t.rows, t.budget) for t in a.tiers] == [
        (t.name, t.rows, t.budget) for t in b.tiers
    ]
    for ta, tb in zip(a.tiers, b.tiers):
        assert (ta.remaps is None) == (tb.remaps is None)
        for ra, rb in zip(ta.remaps or [], tb.remaps or []):
            assert ra.dtype == rb.dtype and np.array_equal(ra, rb)
    assert a.report == json.loads(json.dumps(b.report))


def skewed_plan(one_home=False, host_budget=None):
    rng = np.random.default_rng(5)
    counts = [rng.integers(0, 9, n) for n in (30, 4, 70)]
    opt = SparseOptimizer("rowwise_adagrad")
    prof = AccessProfiler([30, 4, 70], ["a", "b", "c"])
    prof.add_rows(np.stack([rng.integers(0, n, 50) for n in (30, 4, 70)], 1))
    p = prof.finish()
    p.counts = [c.astype(np.int64) for c in counts]
    return plan_placement(p, [4, 4, 4], opt, 25 * row_bytes(4, opt), host_budget, one_home=one_home)


def test_version_1_plan_files_load_to_the_same_plan(tmp_path):
    plan = skewed_plan()
    path = tmp_path / "v1.npz"
    np.savez(path, meta=np.array(json.dumps(v1_meta(plan))),
             **{f"remap_{t}": r for t, r in enumerate(plan.remaps)})  # fmt: skip
    back = PlacementPlan.load(path)
    assert_same_plan(plan, back)
    assert back.tier_names == ["device", "host"] and back.tier("host").rows == "all"
    assert back.replicated and back.num_hot == plan.num_hot == 25
    assert back.host_bytes() == sum(back.table_sizes) * 20 and back.device_bytes() == 25 * 20
    # saving it again writes version 2, which loads to the same plan
    again = PlacementPlan.load(back.save(tmp_path / "v2"))
    assert json.loads((tmp_path / "v2.json").read_text())["version"] == 2
    assert_same_plan(back, again)


def test_version_2_round_trip_is_exact_for_every_tier_layout(tmp_path):
    one_home = skewed_plan(one_home=True, host_budget=10**6)
    assert not one_home.replicated and one_home.tier("host").rows == "rest"
    assert one_home.held_rows("host") == [
        n - h for n, h in zip(one_home.table_sizes, one_home.hot_rows)
    ]
    assert one_home.host_bytes() == (sum(one_home.table_sizes) - 25) * 20
    # three tiers, one home each: device (explicit), host (explicit), ssd (the rest)
    dev = one_home.remaps
    host = [np.full(n, -1, np.int32) for n in one_home.table_sizes]
    off = 0
    for t, r in enumerate(dev):
        free = np.flatnonzero(r < 0)[::2]  # every other cold row on the host
        host[t][free] = np.arange(off, off + free.size)
        off += free.size
    three = PlacementPlan(
        one_home.feature_names, one_home.table_sizes, one_home.dims, one_home.optimizer,
        [TierPlan("device", "explicit", dev, 500), TierPlan("host", "explicit", host, None),
         TierPlan("ssd", "rest", None, 10**9)], replicated=False, report={"note": "by hand"},
    )  # fmt: skip
    three.validate()
    ssd = three.tier_remaps("ssd")
    for t in range(len(three.table_sizes)):
        homes = (dev[t] >= 0).astype(int) + (host[t] >= 0) + (ssd[t] >= 0)
        assert (homes == 1).all()
    assert sum(three.held_rows("ssd")) == sum(three.table_sizes) - 25 - off
    for plan in (skewed_plan(), one_home, three):
        back = PlacementPlan.load(plan.save(tmp_path / "p"))
        assert_same_plan(plan, back)
        with np.load(tmp_path / "p.npz", allow_pickle=False) as z:
            assert sorted(z.files) == sorted(["meta", *plan.arrays()])


def test_inconsistent_tiers_are_refused():
    plan = skewed_plan()
    dev = plan.remaps
    cases = [
        ([TierPlan("host", "all"), TierPlan("device", "explicit", dev)], True, "not fastest first"),
        ([TierPlan("device", "explicit", dev), TierPlan("tape", "rest")], True, "expected distinct"),
        ([TierPlan("device", "explicit", dev), TierPlan("host", "all")], False, "two tiers"),
        ([TierPlan("device", "explicit", dev)], True, "is in no tier"),
        ([TierPlan("device", "explicit", dev), TierPlan("host", "all", None, 100)], True,
         "the host tier needs 2080 bytes, over its budget of 100"),
    ]  # fmt: skip
    for tiers, replicated, msg in cases:
        bad = PlacementPlan(
            plan.feature_names, plan.table_sizes, plan.dims, plan.optimizer, tiers, replicated
        )
        with pytest.raises(PlacementError, match=msg):
            bad.validate()


def test_a_corrupt_or_truncated_plan_file_is_one_line(tmp_path):
    path = skewed_plan().save(tmp_path / "plan")
    raw = path.read_bytes()
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("device_remap_2.npy")
    inside = info.header_offset + 30 + len(info.filename) + 140  # a byte of the array's data
    flipped = bytearray(raw)
    flipped[inside] ^= 0x55
    for name, data in [("flip", bytes(flipped)), ("half", raw[: len(raw) // 2]), ("tail", raw[:-7]),
                       ("empty", b"")]:  # fmt: skip
        bad = tmp_path / f"{name}.npz"
        bad.write_bytes(data)
        with pytest.raises(PlacementError) as e:
            PlacementPlan.load(bad)
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(f"{bad}: not a readable placement plan"), msg

import json

import numpy as np
import pytest

from embeddings import SparseOptimizer
from embeddings.placement import (
    PlacementError,
    PlacementPlan,
    hot_input_mask,
    parse_bytes,
    plan_placement,
    remap_dtype,
    row_bytes,
)
from embeddings.profile import AccessProfile, AccessProfiler

SGD = SparseOptimizer("sgd")


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
    # a float remap (the original FAE bug) is refused
    np.savez(tmp_path / "float.npz", meta=np.array(json.dumps(plan.meta())),
             remap_0=plan.remaps[0].astype(np.float32), remap_1=plan.remaps[1])  # fmt: skip
    with pytest.raises(
        PlacementError, match="remap of table 0 is float32, expected signed integers"
    ):
        PlacementPlan.load(tmp_path / "float.npz")
    broken = [plan.remaps[0].copy(), plan.remaps[1]]
    broken[0][1] = 0  # two rows on hot entry 0
    np.savez(
        tmp_path / "dup.npz",
        meta=np.array(json.dumps(plan.meta())),
        remap_0=broken[0],
        remap_1=broken[1],
    )
    with pytest.raises(PlacementError, match="exactly once"):
        PlacementPlan.load(tmp_path / "dup.npz")

"""The sparse forms used at Terabyte scale give exactly the dense forms' answers: Hotline's
id -> hot slot map (hashed vs dense) and the placement plan's device tier (sorted hot rows vs
remap arrays), in lookups, plans, reports, files and the all-hot classifier."""

import json
import zipfile

import numpy as np
import pytest
import torch

from embeddings import SparseOptimizer
from embeddings.hot_inputs import AllHotClassifier
from embeddings.hot_map import HotRowMap
from embeddings.hot_rows import PlacementError, PlacementPlan, plan_placement, row_bytes
from embeddings.plan import SPARSE_VERSION, VERSION
from embeddings.profile import AccessProfiler
from embeddings.staged.lookup_map import RowOutOfRange, map_lookups

SIZES = [50, 1, 300, 7, 120]
SGD = SparseOptimizer("sgd")


def random_hot(rng, sizes, share):
    """Sorted global hot ids: a random share of each table, its first and last rows included
    where the table is large enough, one table without hot rows."""
    base = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    ids = []
    for t, (b, n) in enumerate(zip(base, sizes)):
        if t == 3:
            continue
        pick = rng.random(n) < share
        pick[0] = pick[-1] = n > 2
        ids.append(np.flatnonzero(pick) + b)
    return torch.from_numpy(np.concatenate(ids).astype(np.int64)), torch.from_numpy(base)


@pytest.mark.parametrize("share", [0.0, 0.05, 0.5, 1.0])
def test_hashed_hot_map_answers_every_row_as_the_dense_map(share):
    rng = np.random.default_rng(int(share * 100))
    hot, base = random_hot(rng, SIZES, share)
    total = sum(SIZES)
    dense = HotRowMap(hot, base, total, dense=True)
    hashed = HotRowMap(hot, base, total, dense=False)
    assert dense.dense and not hashed.dense
    every = torch.arange(total)
    a, b = dense.slots(every), hashed.slots(every)
    assert torch.equal(a, b)
    # the reference: a hot row's slot is its rank among its table's hot rows, -1 when cold
    want = torch.full((total,), -1, dtype=torch.int64)
    for t in range(len(SIZES)):
        rows = hashed.table_hot(t)
        want[rows + base[t]] = torch.arange(rows.numel())
    assert torch.equal(b, want)
    assert torch.equal(dense.n_hot, hashed.n_hot)
    if share == 0.5:  # the hash table is smaller than a dense map of large sparse tables
        big = HotRowMap(hot, base, 10**7, dense=False)
        assert big.nbytes() < 4 * 10**7 // 8


def lookups(rng, sizes, batch):
    lengths = rng.integers(0, 4, (len(sizes), batch))
    values = np.concatenate(
        [rng.integers(0, n, int(lengths[t].sum())) for t, n in enumerate(sizes)]
    )
    return values.astype(np.int64), lengths.reshape(-1).astype(np.int64)


def test_map_lookups_gives_the_same_mapping_with_the_hashed_map():
    rng = np.random.default_rng(3)
    hot, base = random_hot(rng, SIZES, 0.3)
    sizes = np.array(SIZES)
    maps = [HotRowMap(hot, base, sum(SIZES), dense=d) for d in (True, False)]
    for _ in range(5):
        values, lengths = lookups(rng, SIZES, 16)
        a, b = (map_lookups(values, lengths, 16, sizes, base.numpy(), m) for m in maps)
        for x, y in zip((a.slots, a.cold_gids, a.per_table, a.popular),
                        (b.slots, b.cold_gids, b.per_table, b.popular)):  # fmt: skip
            assert np.array_equal(x, y)
    values[-1] = SIZES[-1]  # outside the last table: named, not mapped
    for m in maps:
        with pytest.raises(RowOutOfRange):
            map_lookups(values, lengths, 16, sizes, base.numpy(), m)


def sampled_profile(seed=0):
    rng = np.random.default_rng(seed)
    prof = AccessProfiler(SIZES, [f"f{t}" for t in range(len(SIZES))])
    zipf = [np.minimum(rng.zipf(1.3, 400) - 1, n - 1) for n in SIZES]
    prof.add_rows(np.stack(zipf, 1))
    return prof.finish()


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad"])
def test_sparse_plan_is_the_dense_plan(tmp_path, optimizer):
    opt = SparseOptimizer(optimizer)
    profile = sampled_profile()
    budget = 40 * row_bytes(4, opt)
    dense = plan_placement(profile, [4] * 5, opt, budget, one_home=True, sparse=False)
    sparse = plan_placement(profile, [4] * 5, opt, budget, one_home=True, sparse=True)
    assert sparse.tier("device").remaps is None and dense.tier("device").held is None
    assert sparse.report == dense.report and sparse.report["hot_input_share"] > 0
    for a, b in zip(dense.hot_ids(), sparse.hot_ids()):
        assert np.array_equal(a, b)
    for name in ("device", "host"):
        assert sparse.held_rows(name) == dense.held_rows(name)
        assert sparse.tier_bytes(name) == dense.tier_bytes(name)
    kjt_values, kjt_lengths = lookups(np.random.default_rng(1), SIZES, 32)
    args = (torch.from_numpy(kjt_values), torch.from_numpy(kjt_lengths), 32)
    ca, cb = AllHotClassifier(dense), AllHotClassifier(sparse)
    assert torch.equal(ca.slots(*args), cb.slots(*args))
    assert torch.equal(ca.mask(*args), cb.mask(*args))
    assert sparse.tier("device").remaps is None  # nothing above needed the dense arrays
    # a file: version 3 with the rows, loads to the same plan; materialised it is the dense one
    path = sparse.save(tmp_path / "sparse")
    with zipfile.ZipFile(path) as z:
        assert "device_rows_0.npy" in z.namelist() and "device_remap_0.npy" not in z.namelist()
    assert json.loads(path.with_suffix(".json").read_text())["version"] == SPARSE_VERSION
    back = PlacementPlan.load(path)
    assert back.tier("device").remaps is None
    for a, b in zip(back.tier("device").held, sparse.tier("device").held):
        assert np.array_equal(a, b)
    assert back.meta() == sparse.meta()
    for a, b in zip(back.remaps, dense.remaps):  # materialised on demand
        assert np.array_equal(a, b) and a.dtype == b.dtype
    for a, b in zip(back.tier_remaps("host"), dense.tier_remaps("host")):
        assert np.array_equal(a, b)
    # dense plans are written as before (version 2) and both load
    d = PlacementPlan.load(dense.save(tmp_path / "dense"))
    assert json.loads((tmp_path / "dense.json").read_text())["version"] == VERSION
    assert d.tier("device").held is None


def test_bad_sparse_plan_files_are_one_line(tmp_path):
    plan = plan_placement(sampled_profile(), [4] * 5, SGD, 40 * 16, one_home=True, sparse=True)
    meta = plan.meta()
    arrays = plan.arrays()
    cases = {
        "descending": ("device_rows_2", lambda h: h[::-1].copy(), "ascending, unique"),
        "outside": ("device_rows_0", lambda h: np.append(h, 50).astype(h.dtype), "in 0..49"),
        "floats": ("device_rows_0", lambda h: h.astype(np.float32), "signed integers"),
    }
    for name, (key, change, words) in cases.items():
        bad = dict(arrays, **{key: change(arrays[key])})
        path = tmp_path / f"{name}.npz"
        np.savez(path, meta=np.array(json.dumps(meta)), **bad)
        with pytest.raises(PlacementError, match=words) as e:
            PlacementPlan.load(path)
        assert "\n" not in str(e.value)
    path = tmp_path / "future.npz"
    np.savez(path, meta=np.array(json.dumps(dict(meta, version=4))), **arrays)
    with pytest.raises(PlacementError, match="plan version 4, expected 3, 2 or 1"):
        PlacementPlan.load(path)

"""Slipstream's staleness tracking against brute-force references."""

import math

import numpy as np
import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embeddings import FAEEmbeddingBagCollection, FusedEmbeddingBagCollection, SparseOptimizer
from embeddings.config import tables_for_features
from embeddings.hot_rows import plan_placement
from embeddings.profile import AccessProfiler
from embeddings.staged.hotline import hotline_collection
from embeddings.staleness import StalenessTracker

SIZES = [12, 7, 30]
NAMES = ["a", "b", "c"]


def random_kjt(gen: np.random.Generator, rows: int, max_len: int = 2) -> KeyedJaggedTensor:
    lengths = gen.integers(0, max_len + 1, size=(len(SIZES), rows))
    values = np.concatenate(
        [gen.integers(0, n, size=int(lengths[t].sum())) for t, n in enumerate(SIZES)]
    )
    return KeyedJaggedTensor(
        keys=NAMES, values=torch.from_numpy(values), lengths=torch.from_numpy(lengths.reshape(-1)),
        stride=rows,
    )  # fmt: skip


def make_plan(seed: int = 0, budget_rows: int = 20, opt: str = "sgd", one_home: bool = False):
    gen = np.random.default_rng(seed)
    profiler = AccessProfiler(SIZES, NAMES)
    for _ in range(4):
        profiler.add_kjt(random_kjt(gen, 50))
    o = SparseOptimizer(opt)
    per_row = 4 * (4 + o.state_floats(4))
    return plan_placement(profiler.finish(), [4] * 3, o, budget_rows * per_row, one_home=one_home)


def lookups_of(kjt: KeyedJaggedTensor, rows_per_input: int = 1):
    """Brute force: per input, the (table, row) of every lookup (every step for R > 1)."""
    lengths = kjt.lengths().view(len(SIZES), -1).numpy()
    values, pos = kjt.values().numpy(), 0
    per_row = [[] for _ in range(kjt.stride())]
    for t in range(len(SIZES)):
        for r in range(kjt.stride()):
            for _ in range(lengths[t, r]):
                per_row[r].append((t, int(values[pos])))
                pos += 1
    R = rows_per_input
    return [sum(per_row[i * R : i * R + R], []) for i in range(kjt.stride() // R)]


def test_drift_threshold_and_stale_inputs_match_brute_force():
    plan = make_plan()
    tr = StalenessTracker(plan, "relative", threshold=None, target_skip=0.3)
    n = tr.num_tracked
    assert n == 20
    gen = torch.Generator().manual_seed(0)
    w0 = torch.randn(n, 4, generator=gen)
    # distinct drifts, some rows moving a lot
    step = torch.randn(n, 4, generator=gen) * torch.linspace(0.001, 0.5, n).unsqueeze(1)
    w1 = w0 + step
    sample_kjt = random_kjt(np.random.default_rng(5), 200)
    first = tr.snapshot(w0, None, None)  # the reference: no drift yet
    assert first["snapshot"] == 1 and math.isnan(first["threshold"]) and not tr.stale.any()
    sample = tr.lookups(sample_kjt, 200)
    tr.snapshot(w1, None, sample)
    want = ((w1 - w0).norm(dim=1) / w0.norm(dim=1)).numpy()
    np.testing.assert_allclose(tr.drift.numpy(), want, rtol=1e-6)
    # the threshold makes ceil(0.3 * 200) of the sample skippable (all its rows below it)
    slot = {(int(t), int(r)): i for i, (t, r) in enumerate(zip(tr.tables, tr.rows))}
    per_input = lookups_of(sample_kjt)
    max_drift = [
        max((tr.drift[slot[x]].item() if x in slot else math.inf) for x in lk) if lk else math.inf
        for lk in per_input
    ]
    skippable = sum(m < tr.threshold for m in max_drift)
    k = math.ceil(0.3 * 200)
    assert skippable >= min(k, int(np.isfinite(max_drift).sum())) > 0
    below = float(np.nextafter(np.float32(tr.threshold), np.float32(0)))
    assert sum(m < below for m in max_drift) < k  # the smallest such threshold
    # stale rows and inputs, by brute force
    assert torch.equal(tr.stale, tr.drift < tr.threshold)
    stale_rows = {x for x, i in slot.items() if tr.stale[i]}
    want_inputs = [bool(lk) and all(x in stale_rows for x in lk) for lk in per_input]
    assert tr.stale_inputs(sample).tolist() == want_inputs
    assert sum(want_inputs) == skippable
    # absolute drift: the plain norm
    ab = StalenessTracker(plan, "absolute", threshold=0.1)
    ab.snapshot(w0, None, None)
    ab.snapshot(w1, None, None, extra=torch.ones(n, 4))
    np.testing.assert_allclose(ab.drift.numpy(), (w1 - w0 + 1).norm(dim=1).numpy(), rtol=1e-6)
    assert torch.equal(ab.stale, ab.drift < 0.1)


def test_tbsm_inputs_are_stale_only_when_every_step_is():
    plan = make_plan(1)
    tr = StalenessTracker(plan, threshold=0.5)
    tr.stale = torch.rand(tr.num_tracked, generator=torch.Generator().manual_seed(3)) < 0.9
    kjt = random_kjt(np.random.default_rng(9), 60, max_len=1)
    slot = {(int(t), int(r)): i for i, (t, r) in enumerate(zip(tr.tables, tr.rows))}
    stale_rows = {x for x, i in slot.items() if tr.stale[i]}
    for R in (1, 3):
        got = tr.stale_inputs(tr.lookups(kjt, 60 // R)).tolist()
        want = [bool(lk) and all(x in stale_rows for x in lk) for lk in lookups_of(kjt, R)]
        assert got == want and not all(want)
        assert any(want) or R > 1
    with pytest.raises(ValueError, match="do not split into 7 inputs"):
        tr.lookups(kjt, 7)


@pytest.mark.parametrize("R", [1, 3])
def test_the_one_pass_classification_agrees_with_the_reference(R):
    """`stale_input_mask` (what drop asks of every source batch, numba) against brute force,
    with multi-hot bags, empty bags and int32 ids; an id outside its table is an error."""
    plan = make_plan(2)
    tr = StalenessTracker(plan, threshold=0.5)
    gen = np.random.default_rng(R)
    slot = {(int(t), int(r)): i for i, (t, r) in enumerate(zip(tr.tables, tr.rows))}
    for trial in range(6):
        tr.stale = torch.from_numpy(gen.random(tr.num_tracked) < [0.3, 0.9, 1.0][trial % 3])
        stale_rows = {x for x, i in slot.items() if tr.stale[i]}
        kjt = random_kjt(gen, 60, max_len=trial % 3)
        if trial % 2:
            kjt = KeyedJaggedTensor(keys=NAMES, values=kjt.values().int(), lengths=kjt.lengths(),
                                    stride=60)  # fmt: skip
        got, lookups = tr.stale_input_mask(kjt, 60 // R)
        per_input = lookups_of(kjt, R)
        want = [bool(lk) and all(x in stale_rows for x in lk) for lk in per_input]
        assert got.tolist() == want
        assert lookups.tolist() == [len(lk) for lk in per_input]
    bad = KeyedJaggedTensor(keys=NAMES, values=torch.tensor([0, 7, 1]),
                            lengths=torch.tensor([1, 1, 1]), stride=1)  # fmt: skip
    with pytest.raises(IndexError, match=r"lookup 1 \(id 7\) is outside its table"):
        tr.stale_input_mask(bad, 1)


def test_state_round_trip_and_bad_settings():
    plan = make_plan()
    tr = StalenessTracker(plan, threshold=0.2)
    w = torch.randn(tr.num_tracked, 4)
    tr.snapshot(w, None, None)
    tr.snapshot(w * 1.1, torch.rand(tr.num_tracked), None)
    other = StalenessTracker(plan, threshold=0.2)
    other.load_state_dict(tr.state_dict(), torch.device("cpu"))
    for k, v in tr.state_dict().items():
        assert torch.equal(other.state_dict()[k], v), k
    counted = StalenessTracker(plan, threshold=0.2, min_lookups=2)
    counted.count(random_kjt(np.random.default_rng(0), 10))
    assert counted.looked_up.any()
    other.load_state_dict(counted.state_dict(), torch.device("cpu"))
    assert torch.equal(other.looked_up, counted.looked_up)
    before_counts = {k: v for k, v in tr.state_dict().items() if k != "looked_up"}
    other.load_state_dict(before_counts, torch.device("cpu"))  # a first-round checkpoint
    assert not other.looked_up.any()
    with pytest.raises(ValueError, match="min lookups"):
        StalenessTracker(plan, threshold=0.2, min_lookups=-1)
    small = StalenessTracker(make_plan(budget_rows=5), threshold=0.2)
    with pytest.raises(ValueError, match="tracks 20 rows, this plan 5"):
        small.load_state_dict(tr.state_dict(), torch.device("cpu"))
    with pytest.raises(ValueError, match="metric"):
        StalenessTracker(plan, "cosine", threshold=0.1)
    with pytest.raises(ValueError, match="target skip"):
        StalenessTracker(plan, target_skip=1.0)


@pytest.mark.parametrize("placement", ["device", "fae", "hotline"])
def test_rows_of_reads_the_current_rows_from_any_placement(placement):
    tables = tables_for_features(SIZES, 4, NAMES)
    opt = SparseOptimizer("rowwise_adagrad", 0.5)
    plan = make_plan(opt="rowwise_adagrad", one_home=placement == "hotline")
    if placement == "device":
        coll = FusedEmbeddingBagCollection(tables, opt, seed=3)
    elif placement == "fae":
        coll = FAEEmbeddingBagCollection(tables, opt, plan, seed=3)
    else:
        coll = hotline_collection(tables, opt, plan, seed=3)
    kjt = random_kjt(np.random.default_rng(2), 32)
    for _ in range(3):  # some training, so rows and state differ from their start
        coll(kjt).values().square().sum().backward()
    t = torch.tensor([0, 2, 2, 1, 0])
    r = torch.tensor([3, 29, 0, 6, 11])
    w, s = coll.rows_of(t, r)
    full_w, full_s = coll.table_weights(), coll.optimizer_states()
    for i in range(5):
        assert torch.equal(w[i], full_w[t[i]][r[i]])
        assert torch.equal(s[i], full_s[t[i]][r[i]])
    assert s.abs().sum() > 0


def test_the_random_control_freezes_as_many_rows_at_random():
    tr = StalenessTracker(make_plan(), threshold=0.1)
    tr.stale[:7] = True
    tr.use_random_stale_set(torch.Generator().manual_seed(1))
    a = tr.stale.clone()
    assert int(a.sum()) == 7 and not torch.equal(a[:7], torch.ones(7, dtype=torch.bool))
    tr.use_random_stale_set(torch.Generator().manual_seed(1))
    assert torch.equal(tr.stale, a)  # a function of the generator's seed: nothing to resume


def test_only_rows_looked_up_enough_can_become_stale():
    """`min_lookups`: the trained lookups are counted per tracked row (against a brute-force
    count); at a snapshot a row becomes stale only with at least m of them, a stale row stays
    stale with fewer unless its drift shows it moving, and the threshold's sample treats the
    rows that cannot be stale as untracked."""
    plan = make_plan(3)
    tr = StalenessTracker(plan, threshold=0.5, min_lookups=7)
    n = tr.num_tracked
    slot = {(int(t), int(r)): i for i, (t, r) in enumerate(zip(tr.tables, tr.rows))}
    gen = np.random.default_rng(4)
    w0 = torch.ones(n, 4)
    tr.snapshot(w0, None, None)
    want = np.zeros(n, dtype=np.int64)
    for _ in range(3):
        kjt = random_kjt(gen, 20)
        tr.count(kjt)
        for lk in lookups_of(kjt):
            for x in lk:
                if x in slot:
                    want[slot[x]] += 1
    assert tr.looked_up.tolist() == want.tolist() and (want >= 7).any() and (want < 7).any()
    tr.stale[0], tr.stale[1] = True, True  # as if stale before: row 0 stays, row 1 moves
    w1 = w0.clone()
    w1[1] += 1.0
    judged = torch.from_numpy(want >= 7)
    tr.snapshot(w1, None, None)
    expect = judged & (tr.drift < 0.5)
    expect[0], expect[1] = True, False
    assert torch.equal(tr.stale, expect) and not tr.looked_up.any()
    # the target-skip threshold: a sample input meeting a row nobody looked up is never skippable
    tr2 = StalenessTracker(plan, target_skip=0.99, min_lookups=1)
    tr2.snapshot(w0, None, None)
    kjt = random_kjt(gen, 40)
    tr2.count(random_kjt(gen, 5))
    tr2.snapshot(w0, None, tr2.lookups(kjt, 40))
    seen = tr2.stale.clone()
    m = tr2.input_max_drift(tr2.lookups(kjt, 40))
    for lk, mi in zip(lookups_of(kjt), m.tolist()):
        if any(x not in slot or not seen[slot[x]] for x in lk):
            assert mi == math.inf
    state = tr.state_dict()
    assert torch.equal(state["looked_up"], tr.looked_up)

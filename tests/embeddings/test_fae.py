import numpy as np
import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embeddings import FusedEmbeddingBagCollection, SparseOptimizer, TableSpec
from embeddings.fae import FAEEmbeddingBagCollection
from embeddings.fae_scheduler import window_bounds, window_layout
from embeddings.hot_inputs import AllHotClassifier, all_hot_inputs
from embeddings.hot_rows import PlacementError, plan_placement, row_bytes
from embeddings.profile import AccessProfiler

SIZES = [40, 6, 300, 25]
NAMES = [f"f{i}" for i in range(len(SIZES))]
DIM = 4


def tables(dims=(DIM,) * 4):
    return [TableSpec(f"t{i}", n, d, f) for i, (n, d, f) in enumerate(zip(SIZES, dims, NAMES))]


def kjt_from(lengths: np.ndarray, values: list[np.ndarray]) -> KeyedJaggedTensor:
    return KeyedJaggedTensor(
        keys=NAMES, values=torch.from_numpy(np.concatenate(values).astype(np.int64)),
        lengths=torch.from_numpy(lengths.reshape(-1).astype(np.int32)), stride=lengths.shape[1],
    )  # fmt: skip


def make_batch(rng, batch, hot_only, hot_rows):
    """Jagged batch; hot_only draws every id from the plan's hot rows (ids not in row order)."""
    lengths = rng.integers(0, 3, (len(SIZES), batch))
    values = []
    for t, n in enumerate(SIZES):
        pool = hot_rows[t] if hot_only else np.arange(n)
        values.append(rng.choice(pool, int(lengths[t].sum())))
    return kjt_from(lengths, values)


def make_plan(opt, budget_rows=30, seed=0, one_home=False):
    rng = np.random.default_rng(seed)
    prof = AccessProfiler(SIZES, NAMES)
    # skewed, with the hottest rows away from row 0 (a permutation per table)
    rows = np.stack(
        [rng.permutation(n)[np.minimum(rng.zipf(1.4, 400) - 1, n - 1)] for n in SIZES], 1
    )
    prof.add_rows(rows)
    budget = budget_rows * row_bytes(DIM, opt)
    return plan_placement(prof.finish(), [DIM] * 4, opt, budget, one_home=one_home)


def hot_row_lists(plan):
    return [np.flatnonzero(r >= 0) for r in plan.remaps]


def run_sequence(colls, kinds, seed=0, lr_change_at=None):
    """Feed every collection the same batches and output gradients; check outputs agree."""
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    hot_rows = hot_row_lists(colls[-1].plan)
    for i, kind in enumerate(kinds):
        if i == lr_change_at:
            for c in colls:
                c.set_learning_rate(0.02)
        kjt = make_batch(rng, 12, kind == "hot", hot_rows)
        outs = [c(kjt).values() for c in colls]
        grad = torch.randn(outs[0].shape, generator=gen)
        for o in outs[1:]:
            torch.testing.assert_close(o, outs[0], rtol=1e-5, atol=1e-6)
        for o in outs:
            (o * grad).sum().backward()


def assert_same_tables(a, b, exact):
    for wa, wb in zip(a.table_weights(), b.table_weights()):
        if exact:
            assert torch.equal(wa, wb)
        else:
            torch.testing.assert_close(wa, wb, rtol=1e-5, atol=1e-6)
    for sa, sb in zip(a.optimizer_states(), b.optimizer_states()):
        if sa is None:
            assert sb is None
        else:
            torch.testing.assert_close(sa, sb, rtol=1e-5, atol=1e-6)


KINDS = ["hot", "hot", "cold", "hot", "cold", "cold", "hot", "hot", "hot", "cold", "hot"]


@pytest.mark.parametrize("kind", ["sgd", "rowwise_adagrad", "adagrad"])
def test_fae_trains_exactly_like_the_fused_collection(kind):
    opt = SparseOptimizer(kind, 0.05)
    plan = make_plan(opt)
    ref = FusedEmbeddingBagCollection(tables(), opt, backend="torch", seed=7)
    fae = FAEEmbeddingBagCollection(tables(), opt, plan, seed=7, host_backend="torch")
    run_sequence([ref, fae], KINDS, lr_change_at=5)
    s = fae.counters()
    assert s["hot_batches"] == 7 and s["cold_batches"] == 4 and s["syncs"] >= 6
    assert_same_tables(ref, fae, exact=kind == "sgd")


@pytest.mark.parametrize("kind", ["sgd", "rowwise_adagrad"])
def test_fae_resumes_from_its_exported_state_exactly(kind):
    opt = SparseOptimizer(kind, 0.05)
    plan = make_plan(opt)
    ref = FusedEmbeddingBagCollection(tables(), opt, seed=3)  # fbgemm on CPU when available
    fae = FAEEmbeddingBagCollection(tables(), opt, plan, seed=3)
    run_sequence([ref, fae], KINDS[:5], seed=1)  # ends in a cold phase: the device tier is stale
    # "checkpoint": the exported tables are the synced, full tables
    weights = {k: v.clone() for k, v in fae.state_dict().items()}
    sparse = {k: v.clone() for k, v in fae.sparse_state_dict().items()}
    assert sorted(weights) == [f"t{i}.weight" for i in range(4)]
    assert [tuple(weights[f"t{i}.weight"].shape) for i in range(4)] == [(n, DIM) for n in SIZES]
    resumed = FAEEmbeddingBagCollection(tables(), opt, plan, seed=99)
    resumed.load_state_dict(weights)
    resumed.load_sparse_state_dict(sparse)
    run_sequence([ref, fae, resumed], KINDS[5:], seed=2)
    assert_same_tables(ref, resumed, exact=kind == "sgd")
    assert_same_tables(fae, resumed, exact=True)


def test_counters_and_hot_batches_cross_no_link():
    opt = SparseOptimizer("rowwise_adagrad", 0.05)
    plan = make_plan(opt)
    fae = FAEEmbeddingBagCollection(tables(), opt, plan)
    rng = np.random.default_rng(0)
    hot = make_batch(rng, 10, True, hot_row_lists(plan))
    cold = kjt_from(np.ones((4, 10), np.int64), [np.full(10, n - 1) for n in SIZES])
    assert not (plan.remaps[0][SIZES[0] - 1] >= 0 and plan.remaps[2][SIZES[2] - 1] >= 0)
    fae(hot).values().sum().backward()
    s = fae.counters()
    assert s["emb_bytes_h2d"] == 0 and s["emb_bytes_d2h"] == 0 and s["hot_input_share"] == 1.0
    dirty = int(fae.replica.fast_dirty.sum())
    fae(cold).values().sum().backward()  # switching to cold pushes the dirty hot rows to the host
    s = fae.counters()
    pooled = 10 * 4 * DIM * 4
    assert s["emb_bytes_h2d_lookup"] == pooled and s["emb_bytes_d2h_lookup"] == pooled
    assert s["emb_bytes_d2h_sync"] == dirty * row_bytes(DIM, opt) and s["syncs"] == 1
    assert (
        s["hot_input_share"] == 0.5
        and s["emb_bytes_per_sample"] == (2 * pooled + s["emb_bytes_d2h_sync"]) / 20
    )
    # eval-mode lookups never count or dirty anything
    fae.eval()
    with torch.no_grad():
        fae(cold)
    assert fae.counters()["train_inputs"] == 20


def test_host_only_matches_fused_and_counts_every_lookup():
    opt = SparseOptimizer("sgd", 0.1)
    ref = FusedEmbeddingBagCollection(tables(), opt, seed=5)
    host = FAEEmbeddingBagCollection(tables(), opt, None, seed=5)
    rng = np.random.default_rng(3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        kjt = make_batch(rng, 8, False, None)
        a, b = ref(kjt).values(), host(kjt).values()
        assert torch.equal(a, b)
        g = torch.randn(a.shape, generator=gen)
        (a * g).sum().backward()
        (b * g).sum().backward()
    assert_same_tables(ref, host, exact=True)
    s = host.counters()
    assert s["emb_bytes_h2d"] == s["emb_bytes_d2h"] == 3 * 8 * 4 * DIM * 4 and s["syncs"] == 0
    assert host.placement_info()["kind"] == "host" and s["hot_batches"] == 0
    assert s["cold_batches"] == 3 and host.last_step_kind() == "cold"


def select_inputs(lengths, values, idx):
    """The inputs `idx` of jagged per-table id arrays, as a KJT."""
    per_table = []
    for t, v in enumerate(values):
        bags = np.split(v, np.cumsum(lengths[t])[:-1])
        per_table.append(np.concatenate([bags[i] for i in idx] + [np.zeros(0, np.int64)]))
    return kjt_from(lengths[:, idx], per_table)


def test_one_rule_decides_all_hot_for_scheduler_report_and_forward():
    opt = SparseOptimizer("sgd")
    plan = make_plan(opt, budget_rows=45)
    fae = FAEEmbeddingBagCollection(tables(), opt, plan)
    rng = np.random.default_rng(4)
    lengths = rng.integers(0, 3, (4, 64))
    values = [
        rng.choice(hot_row_lists(plan)[t] if t != 2 else np.arange(SIZES[2]), int(lengths[t].sum()))
        for t in range(4)
    ]
    kjt = kjt_from(lengths, values)
    want = []  # by hand: every lookup of the input is a hot row (no lookup at all: hot)
    for i in range(64):
        bags = [np.split(values[t], np.cumsum(lengths[t])[:-1])[i] for t in range(4)]
        want.append(all(bool((plan.remaps[t][b] >= 0).all()) for t, b in enumerate(bags)))
    assert 0 < sum(want) < 64
    classify = AllHotClassifier(plan)
    assert classify(kjt).tolist() == want
    assert classify(kjt.permute([3, 1, 0, 2])).tolist() == want
    remap, base = plan.concatenated_remap()  # the numpy path the plan's report takes
    flat = np.concatenate(values).astype(np.int64)
    args = (torch.from_numpy(remap), torch.from_numpy(base), torch.from_numpy(flat))
    assert all_hot_inputs(*args, torch.from_numpy(lengths.reshape(-1)), 64).tolist() == want
    # the forward: all-hot inputs train on the device; one more input, not all hot, and it is cold
    hot_idx, cold_idx = np.flatnonzero(want), np.flatnonzero(~np.array(want))
    for idx, kind in [(hot_idx, "hot"), (np.sort(np.append(hot_idx, cold_idx[0])), "cold")]:
        fae(select_inputs(lengths, values, idx)).values().sum().backward()
        assert fae.last_step_kind() == kind
        assert classify(select_inputs(lengths, values, idx)).all() == (kind == "hot")


def test_plans_that_do_not_fit_are_refused():
    opt = SparseOptimizer("sgd")
    plan = make_plan(opt)
    with pytest.raises(PlacementError, match="made for optimizer sgd"):
        FAEEmbeddingBagCollection(tables(), SparseOptimizer("adagrad"), plan)
    other = [TableSpec(f"t{i}", n + (i == 1), DIM, f) for i, (n, f) in enumerate(zip(SIZES, NAMES))]
    with pytest.raises(PlacementError, match="table 1: 6 rows in the plan, 7 in the model"):
        FAEEmbeddingBagCollection(other, opt, plan)


def test_scheduler_layout_keeps_every_input_once_and_batches_pure():
    rng = np.random.default_rng(0)
    for share in (0.0, 0.3, 0.8, 1.0):
        hot = rng.random(8 * 16) < share
        for order in ("interleave", "block"):
            layout = window_layout(hot, 16, order)
            assert len(layout) == 8 and all(len(idx) == 16 for _, idx in layout)
            assert np.array_equal(np.sort(np.concatenate([i for _, i in layout])), np.arange(128))
            assert all(hot[idx].all() for k, idx in layout if k == "hot")
            assert all(np.all(np.diff(idx) > 0) for _, idx in layout)  # original order kept
            kinds = [k for k, _ in layout]
            first, second = ("cold", "hot") if order == "block" else ("hot", "cold")
            assert kinds == sorted(kinds, key=lambda k: k != first)
            assert kinds.count("cold") == -(-int((~hot).sum()) // 16)
    assert window_bounds(10, 4, "interleave") == [(0, 4), (4, 8), (8, 10)]
    assert window_bounds(10, 4, "block") == [(0, 10)]
    with pytest.raises(ValueError, match="--fae-switch-period"):
        window_bounds(10, 0, "interleave")


def test_mixed_widths_need_one_hot_width():
    opt = SparseOptimizer("sgd")
    prof = AccessProfiler(SIZES, NAMES)
    prof.add_rows(np.zeros((3, 4), np.int64))
    plan = plan_placement(prof.finish(), [4, 8, 4, 4], opt, 10**6)
    with pytest.raises(ValueError, match="same width"):
        FAEEmbeddingBagCollection(tables((4, 8, 4, 4)), opt, plan)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["sgd", "rowwise_adagrad"])
def test_fae_on_cuda_trains_like_the_fused_collection(kind):
    opt = SparseOptimizer(kind, 0.05)
    plan = make_plan(opt)
    ref = FusedEmbeddingBagCollection(tables(), opt, backend="torch", seed=7)
    fae = FAEEmbeddingBagCollection(
        tables(), opt, plan, device="cuda", seed=7, host_backend="torch"
    )
    rng = np.random.default_rng(0)
    gen = torch.Generator().manual_seed(0)
    for kind_ in KINDS:
        kjt = make_batch(rng, 12, kind_ == "hot", hot_row_lists(plan))
        a = ref(kjt).values()
        b = fae(kjt.to(torch.device("cuda"))).values()
        assert b.device.type == "cuda"
        torch.testing.assert_close(b.cpu(), a, rtol=1e-5, atol=1e-6)
        g = torch.randn(a.shape, generator=gen)
        (a * g).sum().backward()
        (b * g.cuda()).sum().backward()
    assert_same_tables(ref, fae, exact=False)

"""Hotline's collection: one home per row, cold rows staged, trains exactly like the fused one."""

import numpy as np
import pytest
import torch

from embeddings import FusedEmbeddingBagCollection, SparseOptimizer
from embeddings.errors import TierError
from embeddings.hotline import HotlineEmbeddingBagCollection
from embeddings.kjt_ops import select_inputs
from tests.embeddings.test_fae import DIM, SIZES, make_batch, make_plan, tables


def one_home_plan(opt):
    return make_plan(opt, one_home=True)


def assert_same_tables(a, b, rtol=1e-6):
    for wa, wb in zip(a.table_weights(), b.table_weights()):
        torch.testing.assert_close(wa, wb, rtol=rtol, atol=1e-7)
    for sa, sb in zip(a.optimizer_states(), b.optimizer_states()):
        assert (sa is None) == (sb is None)
        if sa is not None:
            torch.testing.assert_close(sa, sb, rtol=rtol, atol=1e-7)


def split_step(coll, kjt, grad):
    """Hotline's step on a collection: popular inputs, then the rest with staged rows, one update."""
    popular = coll.popular_steps(kjt)
    idx_p, idx_n = torch.nonzero(popular).squeeze(1), torch.nonzero(~popular).squeeze(1)
    staged = None
    with coll.deferred_updates():
        if idx_p.numel():
            (coll(select_inputs(kjt, idx_p)).values() * grad[idx_p]).sum().backward()
        if idx_n.numel():
            part = select_inputs(kjt, idx_n)
            staged = coll.stage(coll.cold_ids(part))
            with coll.using(staged):
                (coll(part).values() * grad[idx_n]).sum().backward()
    coll.count_step(idx_p.numel(), staged, 0.0)
    return popular


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "rowwise_adagrad"])
def test_hotline_split_steps_train_like_the_fused_collection(kind):
    opt = SparseOptimizer(kind, 0.05)
    plan = one_home_plan(opt)
    hot_rows = [np.flatnonzero(r >= 0) for r in plan.remaps]
    ref = FusedEmbeddingBagCollection(tables(), opt, backend="torch", seed=7)
    hl = HotlineEmbeddingBagCollection(tables(), opt, plan, seed=7)
    assert_same_tables(ref, hl, rtol=0)  # same initial values, whatever tier a row is in
    rng, gen = np.random.default_rng(0), torch.Generator().manual_seed(0)
    popular_seen = 0
    for step in range(12):
        if step == 6:
            ref.set_learning_rate(0.02)
            hl.set_learning_rate(0.02)
        kjt = make_batch(rng, 16, step % 3 == 0, hot_rows)
        grad = torch.randn(16, DIM * len(SIZES), generator=gen)
        (ref(kjt).values() * grad).sum().backward()
        popular_seen += int(split_step(hl, kjt, grad).sum())
    assert_same_tables(ref, hl)
    c = hl.counters()
    assert c["hotline_batches"] == 12 and c["popular_inputs"] == popular_seen > 0
    assert c["emb_bytes_h2d_gather"] == c["cold_rows"] * DIM * 4 > 0
    assert c["emb_bytes_d2h_writeback"] > 0 and c["emb_bytes_h2d_sync"] == 0  # nothing synced


def test_one_home_and_plain_backward_updates_match():
    opt = SparseOptimizer("rowwise_adagrad", 0.05)
    plan = one_home_plan(opt)
    hl = HotlineEmbeddingBagCollection(tables(), opt, plan, seed=1)
    ref = FusedEmbeddingBagCollection(tables(), opt, backend="torch", seed=1)
    assert hl.num_hot == plan.num_hot and hl.placement_info()["kind"] == "hotline"
    held = hl.host.collection.table_weights()
    assert sum(w.shape[0] for w in held) <= sum(SIZES) - hl.num_hot + len(SIZES)  # no replica
    rng, gen = np.random.default_rng(3), torch.Generator().manual_seed(3)
    for _ in range(5):  # no staging: forward gathers, backward updates at once
        kjt = make_batch(rng, 8, False, None)
        grad = torch.randn(8, DIM * len(SIZES), generator=gen)
        for c in (ref, hl):
            (c(kjt).values() * grad).sum().backward()
    assert_same_tables(ref, hl)
    hl.eval()
    with torch.no_grad():
        kjt = make_batch(rng, 8, False, None)
        torch.testing.assert_close(hl(kjt).values(), ref(kjt).values(), rtol=1e-6, atol=1e-7)


def test_a_prefetched_row_written_back_before_use_is_refreshed():
    """Adversarial: the next batches' cold rows are staged before this step writes the same rows
    back; the staged copies must be refreshed, never used stale."""
    opt = SparseOptimizer("adagrad", 0.1)
    plan = one_home_plan(opt)
    ref = FusedEmbeddingBagCollection(tables(), opt, backend="torch", seed=2)
    hl = HotlineEmbeddingBagCollection(tables(), opt, plan, seed=2)
    rng, gen = np.random.default_rng(5), torch.Generator().manual_seed(5)
    # a few cold rows per table, shared by every batch (a table with none cold: any rows)
    cold_rows = [np.flatnonzero(r < 0)[:3] if (r < 0).any() else np.arange(3) for r in plan.remaps]
    batches = [make_batch(rng, 6, True, cold_rows) for _ in range(6)]
    staged = [hl.stage(hl.cold_ids(b)) for b in batches[:3]]  # three ahead, before any step
    refreshed = 0
    for i, kjt in enumerate(batches):
        grad = torch.randn(6, DIM * len(SIZES), generator=gen)
        (ref(kjt).values() * grad).sum().backward()
        s = staged[i] if i < len(staged) else hl.stage(hl.cold_ids(kjt))
        with hl.deferred_updates():
            refreshed += hl.refresh_staged(s)
            with hl.using(s):
                (hl(kjt).values() * grad).sum().backward()
    assert refreshed > 0
    assert_same_tables(ref, hl)


def test_exported_tables_round_trip_through_both_tiers():
    opt = SparseOptimizer("adagrad", 0.05)
    plan = one_home_plan(opt)
    hl = HotlineEmbeddingBagCollection(tables(), opt, plan, seed=4)
    gen = torch.Generator().manual_seed(9)
    new_w = [torch.randn(n, DIM, generator=gen) for n in SIZES]
    new_s = [torch.rand(n, DIM, generator=gen) for n in SIZES]
    hl.load_state_dict({f"t{i}.weight": w for i, w in enumerate(new_w)})
    hl.load_sparse_state_dict({f"t{i}.adagrad_state": s for i, s in enumerate(new_s)})
    for a, b in zip(hl.table_weights(), new_w):
        assert torch.equal(a, b)
    for a, b in zip(hl.optimizer_states(), new_s):
        assert torch.equal(a, b)
    hot_t, hot_r = plan.hot_ids()
    assert torch.equal(hl.hot.weight[0], new_w[hot_t[0]][hot_r[0]])  # the device tier got it


def test_learned_popularity_moves_the_hot_rows_and_keeps_the_values():
    opt = SparseOptimizer("rowwise_adagrad", 0.05)
    hl = HotlineEmbeddingBagCollection(tables(), opt, None, seed=6)
    ref = FusedEmbeddingBagCollection(tables(), opt, backend="torch", seed=6)
    assert hl.num_hot == 0
    rng, gen = np.random.default_rng(1), torch.Generator().manual_seed(1)
    plan = one_home_plan(opt)
    looked = 0
    for step in range(8):
        kjt = make_batch(rng, 8, False, None)
        grad = torch.randn(8, DIM * len(SIZES), generator=gen)
        if step < 4:
            hl.observe(kjt)
            looked += kjt.values().numel()
        if step == 4:
            assert hl.learned_batches == 4
            counts = hl.learned_counts()
            assert [c.size for c in counts] == SIZES and sum(int(c.sum()) for c in counts) == looked
            hl.adopt(plan)
            assert hl.num_hot == plan.num_hot
        for c in (ref, hl):
            (c(kjt).values() * grad).sum().backward()
    assert_same_tables(ref, hl)
    with pytest.raises(Exception, match="already adopted"):
        hl.adopt(plan)


def test_a_cold_row_missing_from_the_staged_rows_is_an_error():
    opt = SparseOptimizer("sgd", 0.05)
    plan = one_home_plan(opt)
    hl = HotlineEmbeddingBagCollection(tables(), opt, plan)
    rng = np.random.default_rng(0)
    kjt = make_batch(rng, 8, False, None)
    empty = hl.stage(torch.zeros(0, dtype=torch.int64))
    with pytest.raises(TierError, match="missing from the staged rows"), hl.using(empty):
        hl(kjt)

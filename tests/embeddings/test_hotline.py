"""Hotline's collection: one home per row, cold rows staged, trains exactly like the fused one."""

import numpy as np
import pytest
import torch

from embeddings import FusedEmbeddingBagCollection, SparseOptimizer
from embeddings.errors import TierError
from embeddings.plan import row_bytes
from embeddings.staged.hotline import hotline_collection
from tests.embeddings.test_fae import DIM, SIZES, kjt_from, make_batch, make_plan, tables


def one_home_plan(opt):
    return make_plan(opt, one_home=True)


def assert_same_tables(a, b, rtol=1e-6):
    for wa, wb in zip(a.table_weights(), b.table_weights()):
        torch.testing.assert_close(wa, wb, rtol=rtol, atol=1e-7)
    for sa, sb in zip(a.optimizer_states(), b.optimizer_states()):
        assert (sa is None) == (sb is None)
        if sa is not None:
            torch.testing.assert_close(sa, sb, rtol=rtol, atol=1e-7)


def hotline_step(coll, kjt, grad, staged=None):
    """What the Hotline train pipeline does: stage, load, one lookup, one fused update."""
    staged = staged or coll.stage(kjt, kjt.stride())
    with coll.using(staged) as refreshed:
        (coll(kjt).values() * grad).sum().backward()
    coll.count_step(staged, 0.0)
    return staged, refreshed


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "rowwise_adagrad"])
def test_hotline_steps_train_like_the_fused_collection(kind):
    opt = SparseOptimizer(kind, 0.05)
    plan = one_home_plan(opt)
    hot_rows = [np.flatnonzero(r >= 0) for r in plan.remaps]
    ref = FusedEmbeddingBagCollection(tables(), opt, backend="torch", seed=7)
    hl = hotline_collection(tables(), opt, plan, seed=7)
    assert_same_tables(ref, hl, rtol=0)  # same initial values, whatever tier a row is in
    rng, gen = np.random.default_rng(0), torch.Generator().manual_seed(0)
    popular = cold_rows = 0
    for step in range(12):
        if step == 6:
            ref.set_learning_rate(0.02)
            hl.set_learning_rate(0.02)
        batch = 4 if step < 3 else 16  # the staging slots grow on the way
        kjt = make_batch(rng, batch, step % 3 == 0, hot_rows)
        grad = torch.randn(batch, DIM * len(SIZES), generator=gen)
        (ref(kjt).values() * grad).sum().backward()
        staged, _ = hotline_step(hl, kjt, grad)
        popular += staged.popular_inputs
        cold_rows += staged.rows
    assert_same_tables(ref, hl)
    c = hl.counters()
    assert c["hotline_batches"] == 12 and c["popular_inputs"] == popular > 0
    assert c["cold_rows"] == cold_rows > 0
    assert c["emb_bytes_h2d_gather"] == cold_rows * row_bytes(DIM, opt)  # rows with their state
    assert c["emb_bytes_d2h_writeback"] == cold_rows * row_bytes(DIM, opt)
    assert c["emb_bytes_h2d_sync"] == 0  # nothing synced
    assert 0 < sum(hl.capacity) <= sum(SIZES) - hl.num_hot


def test_an_input_is_popular_when_every_lookup_is_hot():
    opt = SparseOptimizer("sgd", 0.05)
    plan = one_home_plan(opt)
    hl = hotline_collection(tables(), opt, plan)
    hot = [int(np.flatnonzero(r >= 0)[0]) for r in plan.remaps]
    cold = int(np.flatnonzero(plan.remaps[2] < 0)[0])
    # input 0: every lookup hot; input 1: one cold lookup (table 2); input 2: no lookups at all
    lengths = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0]])
    values = [np.array([hot[0], hot[0]]), np.array([hot[1]]),
              np.array([hot[2], cold]), np.array([hot[3]])]  # fmt: skip
    staged = hl.stage(kjt_from(lengths, values), 3)
    assert staged.popular_inputs == 2
    assert staged.gids.tolist() == [int(hl.row_base[2]) + cold]
    assert staged.per_table.tolist() == [0, 0, 1, 0]


def test_training_without_a_pipeline_stages_inline_and_evaluation_reads_both_tiers():
    opt = SparseOptimizer("rowwise_adagrad", 0.05)
    plan = one_home_plan(opt)
    hl = hotline_collection(tables(), opt, plan, seed=1)
    ref = FusedEmbeddingBagCollection(tables(), opt, backend="torch", seed=1)
    assert hl.num_hot == plan.num_hot and hl.placement_info()["kind"] == "hotline"
    held = hl.store.collection.table_weights()
    assert sum(w.shape[0] for w in held) <= sum(SIZES) - hl.num_hot + len(SIZES)  # no replica
    rng, gen = np.random.default_rng(3), torch.Generator().manual_seed(3)
    for _ in range(5):  # forward stages the cold rows itself; they go home on the next load
        kjt = make_batch(rng, 8, False, None)
        grad = torch.randn(8, DIM * len(SIZES), generator=gen)
        for c in (ref, hl):
            (c(kjt).values() * grad).sum().backward()
    assert_same_tables(ref, hl)
    hl.eval()
    with torch.no_grad():
        kjt = make_batch(rng, 8, False, None)
        torch.testing.assert_close(hl(kjt).values(), ref(kjt).values(), rtol=1e-6, atol=1e-7)
    assert_same_tables(ref, hl)  # evaluation wrote nothing


def test_a_prefetched_row_written_back_before_use_is_refreshed():
    """Adversarial: the next batches' cold rows are staged before the steps before them write the
    same rows back; the staged copies must be renewed (from the staging slots for the step just
    before, from the host for older ones), never used stale."""
    opt = SparseOptimizer("adagrad", 0.1)
    plan = one_home_plan(opt)
    ref = FusedEmbeddingBagCollection(tables(), opt, backend="torch", seed=2)
    hl = hotline_collection(tables(), opt, plan, seed=2)
    gen = torch.Generator().manual_seed(5)
    # cold rows of each table (a table with none cold: any rows): even batches read rows a and c,
    # odd ones b and c, so batch 2 shares c with batch 1 and a with batch 0 only
    cold = [np.flatnonzero(r < 0)[:3] if (r < 0).sum() >= 3 else np.arange(3) for r in plan.remaps]
    lengths = np.ones((len(SIZES), 6), dtype=np.int64)
    batches = [
        kjt_from(lengths, [np.resize(c[[i % 2, 2]], 6) for c in cold]) for i in range(6)
    ]  # fmt: skip
    staged = [hl.stage(b, 6) for b in batches[:3]]  # three ahead, before any step
    refreshed = staged_rows = 0
    for i, kjt in enumerate(batches):
        grad = torch.randn(6, DIM * len(SIZES), generator=gen)
        (ref(kjt).values() * grad).sum().backward()
        s, n = hotline_step(hl, kjt, grad, staged[i] if i < len(staged) else None)
        refreshed += n
        staged_rows += s.rows
    assert refreshed > 0
    assert_same_tables(ref, hl)
    # batch 2 was read before steps 0 and 1: step 1's rows came from the slots, step 0's again
    # from the host, whose bytes count on top of the stagings'
    assert hl.counters()["emb_bytes_h2d_gather"] > staged_rows * row_bytes(DIM, opt)


def test_exported_tables_round_trip_through_both_tiers():
    opt = SparseOptimizer("adagrad", 0.05)
    plan = one_home_plan(opt)
    hl = hotline_collection(tables(), opt, plan, seed=4)
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
    t, r = int(hot_t[0]), int(hot_r[0])
    slot = int(hl.hot_map.slots(torch.tensor([int(hl.row_base[t]) + r]))[0])
    assert torch.equal(hl.fast.table_weights()[t][slot], new_w[t][r])  # the device tier got it


def test_learned_popularity_moves_the_hot_rows_and_keeps_the_values():
    opt = SparseOptimizer("rowwise_adagrad", 0.05)
    hl = hotline_collection(tables(), opt, None, seed=6)
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
        (ref(kjt).values() * grad).sum().backward()
        hotline_step(hl, kjt, grad)
    assert_same_tables(ref, hl)
    with pytest.raises(Exception, match="already adopted"):
        hl.adopt(plan)


def test_staged_rows_of_another_batch_and_ids_outside_a_table_are_errors():
    opt = SparseOptimizer("sgd", 0.05)
    hl = hotline_collection(tables(), opt, one_home_plan(opt))
    rng = np.random.default_rng(0)
    kjt, other = make_batch(rng, 8, False, None), make_batch(rng, 3, False, None)
    with pytest.raises(TierError, match="prepared for another mini-batch"):
        with hl.using(hl.stage(other, 3)):
            hl(kjt)
    lengths = np.ones((len(SIZES), 1), dtype=np.int64)
    bad = kjt_from(lengths, [np.array([0]), np.array([6]), np.array([0]), np.array([0])])
    with pytest.raises(TierError, match="row 6 is outside table t1"):
        hl.stage(bad, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["sgd", "adagrad"])
def test_hotline_on_cuda_stages_on_a_side_stream_and_trains_like_the_fused_collection(kind):
    opt = SparseOptimizer(kind, 0.05)
    plan = one_home_plan(opt)
    hot_rows = [np.flatnonzero(r >= 0) for r in plan.remaps]
    ref = FusedEmbeddingBagCollection(tables(), opt, backend="torch", seed=7)
    hl = hotline_collection(tables(), opt, plan, device="cuda", seed=7)
    assert hl.fast.device.type == "cuda"
    rng, gen = np.random.default_rng(0), torch.Generator().manual_seed(0)
    batches = [make_batch(rng, 16, i % 3 == 0, hot_rows) for i in range(9)]
    ahead = [hl.stage(b.to(torch.device("cuda")), 16) for b in batches[:2]]  # two ahead
    for i, kjt in enumerate(batches):
        grad = torch.randn(16, DIM * len(SIZES), generator=gen)
        (ref(kjt).values() * grad).sum().backward()
        on_gpu = kjt.to(torch.device("cuda"))
        staged = ahead.pop(0)
        if i + 2 < len(batches):
            ahead.append(hl.stage(batches[i + 2].to(torch.device("cuda")), 16))
        assert staged.weight.device.type == "cuda"
        with hl.using(staged):
            out = hl(on_gpu).values()
            assert out.device.type == "cuda"
            (out * grad.cuda()).sum().backward()
    assert_same_tables(ref, hl, rtol=1e-5)


def test_staging_slots_made_with_the_device_tier_are_not_regrown(monkeypatch):
    # staging_rows >= the lookups per table: the device tier is never rebuilt (a rebuild copies
    # it whole); with the hashed id map the steps train exactly like the fused collection
    import embeddings.hot_map

    monkeypatch.setattr(embeddings.hot_map, "use_dense", lambda total, hot: False)
    opt = SparseOptimizer("adagrad", 0.05)
    plan = one_home_plan(opt)
    hot_rows = [np.flatnonzero(r >= 0) for r in plan.remaps]
    ref = FusedEmbeddingBagCollection(tables(), opt, backend="torch", seed=7)
    hl = hotline_collection(tables(), opt, plan, seed=7, staging_rows=16)
    assert not hl.hot_map.dense
    assert hl.capacity == [min(16, n - h) for n, h in zip(SIZES, hl.n_hot.tolist())]
    fast = hl.fast
    rng, gen = np.random.default_rng(2), torch.Generator().manual_seed(2)
    for _ in range(6):
        kjt = make_batch(rng, 8, False, hot_rows)  # at most 16 lookups per table
        grad = torch.randn(8, DIM * len(SIZES), generator=gen)
        (ref(kjt).values() * grad).sum().backward()
        hotline_step(hl, kjt, grad)
    assert hl.fast is fast
    assert_same_tables(ref, hl)


def test_stagings_renewed_on_another_thread_after_each_write_back_are_never_used_stale():
    """The pipeline's order with the renewal on its worker: each staging is read two steps
    ahead, before the write-back of the step before its own; right after each write-back the
    stagings still waiting are renewed (`renewal`, run on another thread) and the step's own
    `using` then only copies the rows of the write-back that follows from the slots. Every
    row, read back, equals the fused collection's (no staged row used stale)."""
    import threading

    opt = SparseOptimizer("adagrad", 0.1)
    plan = one_home_plan(opt)
    ref = FusedEmbeddingBagCollection(tables(), opt, backend="torch", seed=2)
    hl = hotline_collection(tables(), opt, plan, seed=2)
    gen = torch.Generator().manual_seed(5)
    cold = [np.flatnonzero(r < 0)[:3] if (r < 0).sum() >= 3 else np.arange(3) for r in plan.remaps]
    lengths = np.ones((len(SIZES), 6), dtype=np.int64)
    # even batches read rows a and c, odd ones b and c: a staging shares a with the batch two
    # before it only (renewed from the tier), c with the one just before (copied from the slots)
    batches = [kjt_from(lengths, [np.resize(c[[i % 2, 2]], 6) for c in cold]) for i in range(8)]
    staged = [hl.stage(b, 6, hl.version) for b in batches[:2]]
    renewed = worker_renewed = 0
    for i, kjt in enumerate(batches):
        grad = torch.randn(6, DIM * len(SIZES), generator=gen)
        (ref(kjt).values() * grad).sum().backward()
        with hl.using(staged[i]) as n:
            renewed += n
            if i + 2 < len(batches):  # the staging two ahead, read now (before this step's
                staged.append(hl.stage(batches[i + 2], 6, hl.version))  # write-back)
            renew = hl.renewal(staged[i + 1].version) if i + 1 < len(batches) else None
            if renew is not None:  # what the pipeline's worker runs after the write-back
                before = staged[i + 1].renewed
                t = threading.Thread(target=renew, args=(staged[i + 1],))
                t.start()
                t.join()
                worker_renewed += staged[i + 1].renewed - before
            (hl(kjt).values() * grad).sum().backward()
    assert worker_renewed > 0 and renewed >= worker_renewed
    assert_same_tables(ref, hl, rtol=0)

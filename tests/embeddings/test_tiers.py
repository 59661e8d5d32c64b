import numpy as np
import pytest
import torch

from embeddings import FusedEmbeddingBagCollection, SparseOptimizer, TableSpec
from embeddings.errors import TierError
from embeddings.memory_tiers import DeviceTier, HostTier, Replica, RowStore, table_row_base
from embeddings.plan import row_bytes
from embeddings.transfer_stats import TransferStats

SIZES = [30, 5, 80, 12]
DIM = 4


def tables():
    return [TableSpec(f"t{i}", n, DIM, f"f{i}") for i, n in enumerate(SIZES)]


def subset_remaps(seed=0):
    """A host tier holding about half of each table's rows, none of table 1, slots not in row order."""
    rng = np.random.default_rng(seed)
    remaps, off = [], 0
    for t, n in enumerate(SIZES):
        held = np.sort(rng.choice(n, 0 if t == 1 else n // 2, replace=False))
        r = np.full(n, -1, np.int32)
        r[held] = off + rng.permutation(held.size)
        off += held.size
        remaps.append(r)
    return remaps


def gids(remaps, held=True):
    base = table_row_base(SIZES).numpy()
    return torch.from_numpy(
        np.concatenate([np.flatnonzero((r >= 0) == held) + b for r, b in zip(remaps, base)])
    )


def set_rows(views, gid, values):
    """Write rows by global id into per-table views."""
    flat = torch.cat(views)
    flat[gid] = values
    with torch.no_grad():
        for v, b, n in zip(views, table_row_base(SIZES).tolist(), SIZES):
            v.copy_(flat[b : b + n])


def jagged(rng, pools, batch):
    lengths = np.stack(
        [rng.integers(0, 3, batch) if len(p) else np.zeros(batch, int) for p in pools]
    )
    values = np.concatenate([rng.choice(p, int(lengths[t].sum())) if len(p) else np.zeros(0, int)
                             for t, p in enumerate(pools)]).astype(np.int64)  # fmt: skip
    offsets = np.concatenate([[0], np.cumsum(lengths.reshape(-1))])
    return torch.from_numpy(values), torch.from_numpy(offsets)


@pytest.mark.parametrize("backend", ["torch", "fbgemm"])
@pytest.mark.parametrize("kind", ["sgd", "rowwise_adagrad", "adagrad"])
def test_a_host_tier_holding_a_subset_round_trips_and_trains_its_rows_exactly(backend, kind):
    opt = SparseOptimizer(kind, 0.1)
    remaps = subset_remaps()
    tier = HostTier(tables(), opt, remaps, backend=backend, seed=3)
    full = FusedEmbeddingBagCollection(tables(), opt, backend="torch", seed=3)
    assert isinstance(tier, RowStore) and tier.held == [15, 0, 40, 6]
    held, other = gids(remaps), gids(remaps, held=False)
    assert tier.holds(held).all() and not tier.holds(other).any()
    # held rows start as the full table's seeded initialisation gives them
    ref_w = torch.cat(full.table_weights())
    w, s = tier.read_rows(held)
    assert torch.equal(w, ref_w[held]) and (s is None) == (kind == "sgd")
    # write-back then read: exact, on the contiguous path and on the per-table fallback
    gen = torch.Generator().manual_seed(0)
    new_w = torch.randn(held.numel(), DIM, generator=gen)
    new_s = None if s is None else torch.rand(s.shape, generator=gen)
    perm = torch.randperm(held.numel(), generator=gen)
    tier.write_rows(held[perm], new_w[perm], None if new_s is None else new_s[perm])
    for flat in (True, False):
        if not flat:
            tier._w_flat = tier._s_flat = None
        w, s = tier.read_rows(held)
        assert torch.equal(w, new_w) and (s is None or torch.equal(s, new_s))
    # training through the tier updates its rows as the full collection updates the same rows
    set_rows(full.table_weights(), held, new_w)
    if new_s is not None:
        set_rows(full.optimizer_states(), held, new_s)
    rng = np.random.default_rng(1)
    pools = [np.flatnonzero(r >= 0) for r in remaps]
    for _ in range(3):
        values, offsets = jagged(rng, pools, 6)
        a, b = tier.pool(values, offsets), full.pooled(values, offsets)
        exact = kind == "sgd" and backend == "torch"
        torch.testing.assert_close(a, b, rtol=0 if exact else 1e-6, atol=0 if exact else 1e-6)
        g = torch.randn(a.shape, generator=gen)
        (a * g).sum().backward()
        (b * g).sum().backward()
    w, s = tier.read_rows(held)
    ref_w = torch.cat(full.table_weights())[held]
    if kind == "sgd" and backend == "torch":
        assert torch.equal(w, ref_w)
    else:
        torch.testing.assert_close(w, ref_w, rtol=1e-5, atol=1e-6)
    if s is not None:
        torch.testing.assert_close(
            s, torch.cat(full.optimizer_states())[held], rtol=1e-5, atol=1e-6
        )


def test_a_row_the_tier_does_not_hold_is_an_error():
    remaps = subset_remaps()
    tier = HostTier(tables(), SparseOptimizer("rowwise_adagrad"), remaps, backend="torch")
    row = int(np.flatnonzero(remaps[2] < 0)[0])
    gid = torch.tensor([int(gids(remaps)[0]), SIZES[0] + SIZES[1] + row])
    msg = f"host tier: row {row} of table t2 is not held here"
    with pytest.raises(TierError, match=msg):
        tier.read_rows(gid)
    with pytest.raises(TierError, match=msg):
        tier.write_rows(gid, torch.zeros(2, DIM), torch.zeros(2))
    with pytest.raises(
        TierError, match="row 0 of table t1 is not held here"
    ):  # a table it holds nothing of
        tier.read_rows(torch.tensor([SIZES[0]]))
    # a lookup of such a row: one input, table t0 a held row, table t2 the row above
    values = torch.tensor([int(np.flatnonzero(remaps[0] >= 0)[0]), row])
    offsets = torch.tensor([0, 1, 1, 2, 2])
    with pytest.raises(TierError, match=msg):
        tier.pool(values, offsets)


@pytest.mark.parametrize("kind", ["sgd", "adagrad"])
def test_a_replica_syncs_dirty_rows_both_ways_and_counts_them(kind):
    opt = SparseOptimizer(kind, 0.5)
    remaps = subset_remaps(seed=2)
    host = HostTier(tables(), opt, remaps, backend="torch", seed=1)
    held = gids(remaps)
    fast_gid = held[::3]  # the device copies some of the host's rows
    dev = DeviceTier(fast_gid, DIM, opt, torch.device("cpu"))
    stats = TransferStats()
    rep = Replica(dev, host, stats)
    rep.refresh()
    w, s = host.read_rows(fast_gid)
    assert torch.equal(dev.weight, w) and (s is None or torch.equal(dev.state, s))
    # the device updates slots 0 and 2: push writes exactly those rows back
    dev.update(torch.tensor([0, 2]), torch.ones(2, DIM))
    assert rep.fast_ahead and rep.fast_dirty.tolist()[:3] == [True, False, True]
    rep.sync()
    w, s = host.read_rows(fast_gid)
    assert torch.equal(w, dev.weight) and (s is None or torch.equal(s, dev.state))
    rb = row_bytes(DIM, opt)
    assert (
        stats.bytes[("device", "host", "sync")] == 2 * rb
        and stats.syncs == 1
        and stats.sync_rows == 2
    )
    # the host changes slot 1's row: pull brings exactly that one
    host.write_rows(
        fast_gid[1:2], torch.full((1, DIM), 7.0), None if s is None else torch.ones(1, DIM)
    )
    rep.slow_updated(torch.tensor([1]))
    rep.sync()
    assert torch.equal(dev.weight[1], torch.full((DIM,), 7.0))
    assert stats.bytes[("host", "device", "sync")] == rb and stats.syncs == 2
    counters = stats.as_dict()
    assert counters["emb_bytes_d2h_sync"] == 2 * rb and counters["emb_bytes_h2d_sync"] == rb

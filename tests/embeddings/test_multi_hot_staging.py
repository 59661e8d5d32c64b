"""Staging bags of many ids: each unique cold id staged once, every id of it written back, and
stagings made ahead of time renewed exactly, also across a mini-batch without any cold row."""

import numpy as np
import pytest
import torch

from embeddings import FusedEmbeddingBagCollection, SparseOptimizer
from embeddings.ssd.collection import ScmSettings, tiered_collection
from embeddings.staged.hotline import hotline_collection
from tests.embeddings.test_fae import DIM, SIZES, kjt_from, make_plan, tables
from tests.embeddings.test_hotline import assert_same_tables


def bags(rng, batch, pools, sizes=(3, 1, 2, 4)):
    """Bags of `sizes[t]` ids drawn from `pools[t]` (repeats inside a bag), every 5th empty."""
    lengths = np.array([[0 if i % 5 == 4 else n for i in range(batch)] for n in sizes])
    return kjt_from(lengths, [rng.choice(p, int(k.sum())) for p, k in zip(pools, lengths)])


@pytest.mark.parametrize("store", ["host", "ssd"])
def test_stagings_ahead_stay_exact_across_a_batch_without_cold_rows(tmp_path, store):
    """Three mini-batches staged before any is trained (Hotline's pipeline two ahead): A and C
    share cold rows, B is all hot. C's staging read those rows before A's update reached the
    store, so loading C must renew them although B, just before it, wrote nothing back."""
    opt = SparseOptimizer("adagrad", 0.05)
    plan = make_plan(opt, one_home=True)
    hot = [np.flatnonzero(r >= 0) for r in plan.remaps]
    cold = [np.flatnonzero(r < 0)[:3] for r in plan.remaps]
    ref = FusedEmbeddingBagCollection(tables(), opt, backend="torch", seed=7)
    if store == "host":
        coll = hotline_collection(tables(), opt, plan, seed=7)
    else:
        scm = ScmSettings(str(tmp_path / "tier"), cache_bytes=256, io="buffered")
        coll = tiered_collection(tables(), opt, plan, scm, seed=7)
        with torch.no_grad():  # the tier's own initial rows
            for w, x in zip(ref.table_weights(), coll.table_weights(), strict=True):
                w.copy_(x)
    rng, gen = np.random.default_rng(0), torch.Generator().manual_seed(0)
    kjts = [bags(rng, 10, [np.concatenate([h, c]) for h, c in zip(hot, cold)]),
            bags(rng, 10, hot), bags(rng, 10, [np.concatenate([h, c]) for h, c in zip(hot, cold)])]  # fmt: skip
    staged = [coll.stage(k, 10, coll.version) for k in kjts]
    assert staged[1].rows == 0 and staged[0].rows > 0 and staged[2].rows > 0
    assert np.intersect1d(staged[0].gids.numpy(), staged[2].gids.numpy()).size > 0
    # one staged row per unique cold id, however many bags and lookups name it
    ids = set(coll.global_ids(kjts[0]).tolist())
    assert staged[0].gids.tolist() == sorted(ids - set(coll.hot_gids.tolist()))
    for k, s in zip(kjts, staged):
        grad = torch.randn(10, DIM * len(SIZES), generator=gen)
        (ref(k).values() * grad).sum().backward()
        with coll.using(s):
            (coll(k).values() * grad).sum().backward()
    assert_same_tables(ref, coll, rtol=0)
    if store == "ssd":
        coll.store.tier.close()

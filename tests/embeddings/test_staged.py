"""The staged collection with its cold store injected: the host tier, the SSD tier or any other
`RowStore`; staging declared through embeddings/staged/contract.py; counters each collection logs."""

import numpy as np
import pytest
import torch

from embeddings import FusedEmbeddingBagCollection, SparseOptimizer
from embeddings.fae import FAEEmbeddingBagCollection
from embeddings.fused import uniform_table
from embeddings.memory_tiers import HostTier
from embeddings.row_store import RowStore
from embeddings.ssd.collection import ScmSettings, tiered_collection
from embeddings.ssd.store import ScmStore
from embeddings.staged.collection import StagedEmbeddingBagCollection, one_home
from embeddings.staged.contract import stages
from embeddings.staged.hotline import hotline_collection
from embeddings.transfer_stats import LOGGED_COUNTERS
from tests.embeddings.test_fae import DIM, SIZES, make_batch, make_plan, tables
from tests.embeddings.test_hotline import assert_same_tables, hotline_step


class DenseStore(RowStore):
    """Every row in two plain tensors: a store the staged collection has never seen."""

    name, backend = "host", "dense"

    def __init__(self, opt: SparseOptimizer, seed: int) -> None:
        self.weight = torch.cat([uniform_table(n, DIM, t, seed) for t, n in enumerate(SIZES)])
        rows = self.weight.shape[0]
        state = {"sgd": None, "adagrad": (rows, DIM), "rowwise_adagrad": (rows,)}[opt.kind]
        self.state = None if state is None else torch.zeros(state)
        self.seed, self.reads = seed, 0

    def holds(self, ids):
        return torch.ones(ids.shape, dtype=torch.bool)

    def read_rows(self, ids):
        self.reads += ids.numel()
        return self.weight[ids].clone(), None if self.state is None else self.state[ids].clone()

    def write_rows(self, ids, weights, state):
        self.weight[ids] = weights
        if state is not None:
            self.state[ids] = state

    def init_rows(self, table, rows, out):
        out.copy_(uniform_table(SIZES[table], DIM, table, self.seed)[rows])


def _train(colls, steps=8, seed=0, hot_rows=None):
    rng, gen = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    for _ in range(steps):
        kjt = make_batch(rng, 8, False, hot_rows)
        grad = torch.randn(8, DIM * len(SIZES), generator=gen)
        for c in colls:
            if isinstance(c, StagedEmbeddingBagCollection):
                hotline_step(c, kjt, grad)
            else:
                (c(kjt).values() * grad).sum().backward()


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "rowwise_adagrad"])
def test_a_host_store_passed_in_gives_exactly_the_hotline_collection(kind):
    opt = SparseOptimizer(kind, 0.05)
    plan = make_plan(opt, one_home=True)
    store = HostTier(tables(), opt, one_home(plan, "host").tier_remaps("host"), seed=7)
    injected = StagedEmbeddingBagCollection(tables(), opt, plan, store, seed=7)
    built = hotline_collection(tables(), opt, plan, seed=7)
    ref = FusedEmbeddingBagCollection(tables(), opt, backend="torch", seed=7)
    assert injected.placement_info() == built.placement_info()
    _train([injected, built, ref])
    assert_same_tables(injected, built, rtol=0)
    assert_same_tables(injected, ref)
    timed = {"gather_s", "exposed_gather_s", "hidden_share", "sync_s"}
    a, b = injected.counters(), built.counters()
    assert {k: v for k, v in a.items() if k not in timed} == {
        k: v for k, v in b.items() if k not in timed
    }


@pytest.mark.parametrize("kind", ["sgd", "rowwise_adagrad"])
def test_any_row_store_can_hold_the_cold_rows(kind):
    opt = SparseOptimizer(kind, 0.05)
    store = DenseStore(opt, seed=3)
    coll = StagedEmbeddingBagCollection(tables(), opt, make_plan(opt), store, seed=3)
    ref = FusedEmbeddingBagCollection(tables(), opt, backend="torch", seed=3)
    assert_same_tables(coll, ref, rtol=0)  # the hot rows started from the store's values
    _train([coll, ref], seed=1)
    assert_same_tables(coll, ref)
    assert store.reads > 0 and coll.counters()["cold_rows"] > 0
    info = coll.placement_info()
    assert info["kind"] == "hotline" and info["backend"].startswith("hotline(host=dense,")
    with pytest.raises(Exception, match="rows are fixed"):  # it cannot give rows away
        StagedEmbeddingBagCollection(tables(), opt, None, DenseStore(opt, 3)).adopt(make_plan(opt))


def test_staging_is_declared_by_the_staged_collections_only(tmp_path):
    opt = SparseOptimizer("adagrad", 0.05)
    plan = make_plan(opt, one_home=True)
    hotline = hotline_collection(tables(), opt, plan)
    tiered = tiered_collection(tables(), opt, plan, ScmSettings(str(tmp_path), 4096, "buffered"))
    assert isinstance(tiered.store, ScmStore) and isinstance(hotline.store, HostTier)
    assert all(isinstance(c.store, RowStore) for c in (hotline, tiered))
    assert stages(hotline) and stages(tiered)
    fused = FusedEmbeddingBagCollection(tables(), opt)
    fae = FAEEmbeddingBagCollection(tables(), opt, make_plan(opt))
    assert not stages(fused) and not stages(fae)
    # each collection names the counters it logs; only the SSD tier's are scm_*
    assert fused.logged_counters() == () and fae.logged_counters() == LOGGED_COUNTERS
    assert hotline.logged_counters() == LOGGED_COUNTERS
    scm = [k for k in tiered.logged_counters() if k not in LOGGED_COUNTERS]
    assert scm and all(k.startswith("scm_") for k in scm)
    _train([tiered], steps=3)
    assert set(tiered.logged_counters()) <= set(tiered.counters())
    assert (
        tiered.placement_info()["kind"] == "tiered" and "ssd_tier_bytes" in tiered.placement_info()
    )
    tiered.store.tier.close()

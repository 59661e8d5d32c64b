"""The embedding-collection contract, the same for every collection."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from embeddings import (
    EmbeddingCollection,
    FAEEmbeddingBagCollection,
    FusedEmbeddingBagCollection,
    SparseOptimizer,
)
from embeddings.errors import PlacementError
from embeddings.placement import plan_placement
from embeddings.profile import AccessProfiler
from embeddings.transfer_stats import LEGACY_VALUES, TransferStats
from tests.embeddings.test_fae import (
    KINDS,
    hot_row_lists,
    make_batch,
    make_plan,
    run_sequence,
    tables,
)

ROOT = Path(__file__).resolve().parents[2]
COUNTER_KEYS = {
    "emb_bytes_h2d", "emb_bytes_d2h", "emb_bytes_h2d_lookup", "emb_bytes_d2h_lookup",
    "emb_bytes_h2d_sync", "emb_bytes_d2h_sync", "syncs", "sync_rows", "sync_s", "hot_batches",
    "cold_batches", "train_inputs", "hot_inputs", "hot_input_share", "emb_bytes_per_sample",
    "emb_bytes_h2d_gather", "emb_bytes_d2h_gather", "emb_bytes_h2d_writeback",
    "emb_bytes_d2h_writeback", "popular_inputs", "hotline_batches", "cold_rows", "gather_s",
    "exposed_gather_s", "popular_input_share", "cold_rows_per_batch", "hidden_share",
}  # fmt: skip


def three_collections(opt, seed=0):
    plan = make_plan(opt)
    return plan, {
        "device": FusedEmbeddingBagCollection(tables(), opt, seed=seed),
        "fae": FAEEmbeddingBagCollection(tables(), opt, plan, seed=seed),
        "host": FAEEmbeddingBagCollection(tables(), opt, None, seed=seed),
    }


def test_every_collection_has_the_same_counters_and_says_where_rows_live():
    opt = SparseOptimizer("rowwise_adagrad", 0.05)
    plan, colls = three_collections(opt)
    for kind, c in colls.items():
        assert isinstance(c, EmbeddingCollection)
        assert set(c.counters()) == COUNTER_KEYS, kind
        info = c.placement_info()
        assert info["kind"] == kind and info["backend"] == c.backend
        assert not c.replicated_across_ranks()
    fused = colls["device"].counters()
    assert fused["hot_input_share"] == 1.0 and fused["emb_bytes_per_sample"] == 0.0
    ratios = ("hot_input_share", "emb_bytes_per_sample")
    hotline_ratios = ("popular_input_share", "cold_rows_per_batch", "hidden_share")
    assert all(fused[k] is None for k in hotline_ratios)  # no Hotline step
    assert all(v == 0 for k, v in fused.items() if k not in ratios + hotline_ratios)
    assert colls["host"].counters()["hot_input_share"] is None  # nothing trained yet
    run_sequence([colls["host"], colls["fae"]], KINDS[:3])
    assert colls["host"].counters()["hot_input_share"] == 0.0
    info = colls["fae"].placement_info()
    assert info["hot_rows"] == plan.num_hot and info["device_tier_bytes"] == plan.device_bytes()
    assert (
        info["host_tier_bytes"] == plan.host_bytes() and info["device_budget"] == plan.device_budget
    )
    assert info["plan_hot_input_share_sample"] == plan.report["hot_input_share"]
    assert info["plan_hot_lookup_share_sample"] == plan.report["hot_lookup_share"]
    assert colls["device"].last_step_kind() is None and colls["fae"].last_step_kind() == "cold"


def test_extra_state_round_trips_and_old_checkpoint_counters_load():
    opt = SparseOptimizer("sgd", 0.05)
    _, colls = three_collections(opt)
    assert colls["device"].extra_state() == {}
    colls["device"].load_extra_state({})
    with pytest.raises(KeyError, match="placement_stats"):
        colls["device"].load_extra_state({"placement_stats": torch.zeros(11, dtype=torch.int64)})
    fae = colls["fae"]
    run_sequence([fae], KINDS)
    state = fae.extra_state()
    assert (
        sorted(state) == ["placement_stats"]
        and state["placement_stats"].numel() == TransferStats().state_tensor().numel()
    )
    fresh = FAEEmbeddingBagCollection(tables(), opt, fae.plan)
    fresh.load_extra_state(state)
    a, b = fresh.counters(), fae.counters()
    assert a.pop("sync_s") == pytest.approx(b.pop("sync_s"), abs=1e-9) and a == b  # kept in ns
    # the 11 values checkpoints of HybridEmbeddingBagCollection held, in their order
    old = torch.tensor([10, 20, 30, 40, 5, 6, 7, 8, 90, 45, 2_500_000_000])
    fresh.load_extra_state({"placement_stats": old})
    c = fresh.counters()
    assert [c[k] for k in ("emb_bytes_h2d_lookup", "emb_bytes_d2h_lookup", "emb_bytes_h2d_sync",
                           "emb_bytes_d2h_sync", "syncs", "sync_rows", "hot_batches",
                           "cold_batches", "train_inputs", "hot_inputs")] == old[:10].tolist()  # fmt: skip
    assert c["sync_s"] == 2.5 and c["emb_bytes_h2d"] == 40 and c["hot_input_share"] == 0.5
    saved = fresh.extra_state()["placement_stats"]
    assert torch.equal(saved[:LEGACY_VALUES], old) and not saved[LEGACY_VALUES:].any()
    with pytest.raises(KeyError, match="unexpected checkpoint state x"):
        fresh.load_extra_state({"x": old})


def test_counters_of_a_further_link_add_keys_and_checkpoint_values():
    stats = TransferStats(links=(("ssd", "host"), ("host", "ssd")))
    stats.add_bytes("ssd", "host", "lookup", 64)
    stats.add_bytes("host", "ssd", "sync", 32)
    stats.add_bytes("host", "device", "lookup", 16)
    d = stats.as_dict()
    assert COUNTER_KEYS < set(d)
    assert d["emb_bytes_s2h_lookup"] == 64 and d["emb_bytes_h2s"] == 32 and d["emb_bytes_h2d"] == 16
    back = TransferStats(links=(("ssd", "host"), ("host", "ssd")))
    back.load_state_tensor(stats.state_tensor())
    assert back.as_dict() == d
    back.load_state_tensor(TransferStats().state_tensor())  # from before the link existed
    assert back.as_dict()["emb_bytes_s2h"] == 0
    with pytest.raises(ValueError, match="12 values, expected 28"):
        back.load_state_tensor(torch.zeros(12, dtype=torch.int64))
    with pytest.raises(KeyError, match="no link ssd->device"):
        stats.add_bytes("ssd", "device", "lookup", 1)


def test_writes_into_the_exported_tables_reach_the_device_tier():
    opt = SparseOptimizer("sgd", 0.05)
    plan, colls = three_collections(opt, seed=4)
    fae, ref = colls["fae"], colls["device"]
    run_sequence([ref, fae], KINDS[:4])  # ends hot: the device tier is ahead of the host
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for a, b in zip(fae.table_weights(), ref.table_weights()):
            new = torch.randn(a.shape, generator=gen)
            a.copy_(new)
            b.copy_(new)
    fae.after_tables_written()
    fae.eval()
    kjt = make_batch(np.random.default_rng(9), 8, True, hot_row_lists(plan))
    with torch.no_grad():
        assert torch.equal(fae(kjt).values(), ref(kjt).values())


def test_fae_refuses_a_one_home_plan():
    opt = SparseOptimizer("sgd")
    prof = AccessProfiler([40, 6, 300, 25], ["f0", "f1", "f2", "f3"])
    prof.add_rows(np.zeros((3, 4), np.int64))
    plan = plan_placement(prof.finish(), [4] * 4, opt, 10**6, one_home=True)
    with pytest.raises(PlacementError, match="host tier must hold every row"):
        FAEEmbeddingBagCollection(tables(), opt, plan)


def test_the_planning_modules_do_not_import_torchrec_or_fbgemm():
    code = (
        "import sys, embeddings.config, embeddings.placement, embeddings.errors;"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('torchrec', 'fbgemm_gpu')];"
        "assert not heavy, heavy[:3]; print(embeddings.__file__)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(ROOT / "embeddings" / "__init__.py")

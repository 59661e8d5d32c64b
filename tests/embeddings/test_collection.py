"""The embedding-collection contract, the same for every collection: every class that implements
it (`EVERY_COLLECTION`, checked against the subclasses found in embeddings/) is built on small
tables and held to the promises of embeddings/collection.py."""

import hashlib
import importlib
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

import embeddings
from embeddings import (
    EmbeddingCollection,
    FAEEmbeddingBagCollection,
    FusedEmbeddingBagCollection,
    SparseOptimizer,
)
from embeddings.collection import EmbeddingLookup
from embeddings.errors import PlacementError
from embeddings.hot_replicated import HotReplicatedCollection
from embeddings.hot_rows import plan_placement
from embeddings.profile import AccessProfiler
from embeddings.quantized import QuantizedEmbeddingBagCollection, quantize_rows
from embeddings.sharded import ShardedEmbeddingBagCollection
from embeddings.ssd.collection import ScmSettings, tiered_collection
from embeddings.ssd.serving import ScmQuantizedEmbeddingBagCollection, ServingTier
from embeddings.staged.collection import StagedEmbeddingBagCollection
from embeddings.staged.hotline import hotline_collection
from embeddings.transfer_stats import LEGACY_VALUES, TransferStats
from tests.embeddings.test_fae import (
    DIM,
    KINDS,
    NAMES,
    SIZES,
    hot_row_lists,
    kjt_from,
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
        "import sys, embeddings.config, embeddings.hot_rows, embeddings.errors;"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('torchrec', 'fbgemm_gpu')];"
        "assert not heavy, heavy[:3]; print(embeddings.__file__)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(ROOT / "embeddings" / "__init__.py")


# --- the contract, over every collection class --------------------------------------------------

OPT = SparseOptimizer("rowwise_adagrad", 0.1)
PRECISIONS = ["int8", "fp16", "int4", "fp32"]


@pytest.fixture(scope="module")
def process_group(tmp_path_factory):
    """A one-process gloo group: what torchrec's sharded collections are built in."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _quantized_rows(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [quantize_rows(torch.randn(t.num_embeddings, t.embedding_dim, generator=gen), p)
            for t, p in zip(tables(), PRECISIONS)]  # fmt: skip


def _scm_serving(tmp):
    rows, sources = _quantized_rows(), []
    for t, r in zip(tables(), rows):
        path = tmp / f"{t.name}.npy"
        np.save(path, r.numpy(), allow_pickle=False)
        sources.append((path, hashlib.sha256(path.read_bytes()).hexdigest()))
    tier = ServingTier(tmp / "serve", tables(), PRECISIONS, sources, 4096, io="buffered")
    return ScmQuantizedEmbeddingBagCollection(tier)


def _tiered(tmp):
    scm = ScmSettings(directory=str(tmp / "scm"), cache_bytes=1024, io="buffered")
    return tiered_collection(tables(), OPT, make_plan(OPT, one_home=True), scm, seed=3)


def _hot_replicated(tmp, request):
    request.getfixturevalue("process_group")
    hot = hot_row_lists(make_plan(OPT))
    return HotReplicatedCollection(tables(), OPT, hot, seed=3)


def _sharded(tmp, request):
    request.getfixturevalue("process_group")
    return ShardedEmbeddingBagCollection(tables(), OPT, torch.device("cpu"), seed=3)


# name -> (class, builder(tmp_path, request)); the fbgemm and the pure-PyTorch fused lookups are
# both the fused class, and so are the host tier's (FAE without a plan) and the device's
EVERY_COLLECTION = {
    "device": (FusedEmbeddingBagCollection, lambda tmp, rq: FusedEmbeddingBagCollection(
        tables(), OPT, seed=3)),
    "device-torch": (FusedEmbeddingBagCollection, lambda tmp, rq: FusedEmbeddingBagCollection(
        tables(), OPT, backend="torch", seed=3)),
    "host": (FAEEmbeddingBagCollection, lambda tmp, rq: FAEEmbeddingBagCollection(
        tables(), OPT, None, seed=3)),
    "fae": (FAEEmbeddingBagCollection, lambda tmp, rq: FAEEmbeddingBagCollection(
        tables(), OPT, make_plan(OPT), seed=3)),
    "hotline": (StagedEmbeddingBagCollection, lambda tmp, rq: hotline_collection(
        tables(), OPT, make_plan(OPT, one_home=True), seed=3)),
    "tiered": (StagedEmbeddingBagCollection, lambda tmp, rq: _tiered(tmp)),
    "sharded": (ShardedEmbeddingBagCollection, _sharded),
    "hot_replicated": (HotReplicatedCollection, _hot_replicated),
    "quantized": (QuantizedEmbeddingBagCollection, lambda tmp, rq: QuantizedEmbeddingBagCollection(
        tables(), PRECISIONS, _quantized_rows())),
    "quantized-torch": (QuantizedEmbeddingBagCollection,
                        lambda tmp, rq: QuantizedEmbeddingBagCollection(
                            tables(), PRECISIONS, _quantized_rows(), backend="torch")),
    "scm_serving": (ScmQuantizedEmbeddingBagCollection, lambda tmp, rq: _scm_serving(tmp)),
}  # fmt: skip


@pytest.fixture(params=sorted(EVERY_COLLECTION))
def collection(request, tmp_path):
    cls, build = EVERY_COLLECTION[request.param]
    coll = build(tmp_path, request)
    assert type(coll) is cls
    yield coll
    tier = getattr(coll, "tier", None)  # the SSD-served collection holds its file open
    if tier is not None:
        tier.close()


def _batch(seed, batch=8):
    """A batch with its keys in reverse feature order (a collection reorders them)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 4, (len(SIZES), batch))
    lengths[:, 0] = 1  # every table looked up
    values = [rng.integers(0, n, int(lengths[t].sum())) for t, n in enumerate(SIZES)]
    kjt = kjt_from(lengths, values)
    order = NAMES[::-1]
    return kjt, KeyedJaggedTensor.from_jt_dict({k: kjt[k] for k in order}), values


def _reference(weights, kjt):
    """Sum-pooled rows of the exported tables, [batch, sum of dims]."""
    out = []
    for name, w in zip(NAMES, weights):
        jt = kjt[name]
        idx, offs = jt.values(), jt.offsets()
        out.append(F.embedding_bag(idx, w.float().cpu(), offs[:-1], mode="sum"))
    return torch.cat(out, dim=1)


def test_the_contract_test_covers_every_collection_class():
    for info in pkgutil.iter_modules(embeddings.__path__):
        importlib.import_module(f"embeddings.{info.name}")
    found, todo = set(), [EmbeddingLookup]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("embeddings.") and not inspect.isabstract(sub):
                found.add(sub)
    covered = {cls for cls, _ in EVERY_COLLECTION.values()}
    assert found == covered, sorted(c.__name__ for c in found ^ covered)


def test_lookups_are_the_exported_rows_pooled_in_feature_order(collection):
    c = collection
    assert isinstance(c, EmbeddingLookup)
    assert c.feature_names == NAMES and c.dims == [t.embedding_dim for t in c.tables]
    kjt, reordered, _ = _batch(1)
    c.eval()
    with torch.no_grad():
        out = c(reordered)
    assert out.keys() == NAMES and out.length_per_key() == c.dims
    assert tuple(out.values().shape) == (8, sum(c.dims))
    c.sync()
    weights = c.table_weights()
    assert [tuple(w.shape) for w in weights] == [(n, DIM) for n in SIZES]
    torch.testing.assert_close(out.values().cpu(), _reference(weights, kjt), rtol=1e-5, atol=1e-5)


def test_the_state_dict_is_the_exported_tables(collection):
    c = collection
    state = c.state_dict()
    assert sorted(state) == sorted(f"{t.name}.weight" for t in c.tables)
    for t, w in zip(c.tables, c.table_weights()):
        assert torch.equal(state[f"{t.name}.weight"].cpu(), w.detach().cpu())
    counters, info = c.counters(), c.placement_info()
    assert isinstance(counters, dict) and all(isinstance(k, str) for k in counters)
    assert all(v is None or isinstance(v, int | float) for v in counters.values())
    assert info["backend"] == c.backend and isinstance(info["kind"], str)
    if isinstance(c, EmbeddingCollection):
        return
    # lookup only: nothing to train, and weights handed to it would be silently unused
    assert not hasattr(c, "set_learning_rate") and not hasattr(c, "optimizer_states")
    with pytest.raises(RuntimeError, match="built from its rows"):
        c.load_state_dict(state)


def _trainable(collection) -> EmbeddingCollection:
    if not isinstance(collection, EmbeddingCollection):
        pytest.skip(f"{type(collection).__name__} is lookup only")
    return collection


def _step(c, seed):
    kjt, reordered, values = _batch(seed)
    c.train()
    out = c(reordered)
    grad = torch.randn(out.values().shape, generator=torch.Generator().manual_seed(seed))
    (out.values() * grad.to(out.values().device)).sum().backward()
    c.sync()
    return values


def _rows_changed(before, after):
    return [
        torch.nonzero((a.cpu() != b.cpu()).reshape(a.shape[0], -1).any(1)).flatten().tolist()
        for a, b in zip(before, after)
    ]


def test_a_step_changes_exactly_the_rows_looked_up(collection):
    c = _trainable(collection)
    w0 = [w.detach().cpu().clone() for w in c.table_weights()]
    s0 = [s.detach().cpu().clone() for s in c.optimizer_states()]
    values = _step(c, 2)
    looked_up = [sorted(set(v.tolist())) for v in values]
    assert _rows_changed(w0, c.table_weights()) == looked_up
    assert _rows_changed(s0, c.optimizer_states()) == looked_up
    c.set_learning_rate(0.0)  # the fused optimizer's rate from the next backward on
    w1 = [w.detach().cpu().clone() for w in c.table_weights()]
    _step(c, 3)
    assert _rows_changed(w1, c.table_weights()) == [[]] * len(SIZES)


def test_tables_and_optimizer_state_round_trip_through_the_state_dicts(collection, tmp_path):
    c = _trainable(collection)
    _step(c, 4)
    state, sparse = c.state_dict(), c.sparse_state_dict()
    extra = c.extra_state()
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for w in c.table_weights():
            w.copy_(torch.randn(w.shape, generator=gen))
        for s in c.optimizer_states():
            s.zero_()
    c.after_tables_written()
    c.load_state_dict(state)
    c.load_sparse_state_dict(sparse)
    c.load_extra_state(extra)
    c.sync()
    for t, w in zip(c.tables, c.table_weights()):
        assert torch.equal(w.detach().cpu(), state[f"{t.name}.weight"].cpu())
    for key, s in c.sparse_state_dict().items():
        assert torch.equal(s.cpu(), sparse[key].cpu())
    rows, states = c.rows_of(torch.tensor([0, 2, 3]), torch.tensor([5, 299, 0]))
    assert torch.equal(rows[1], state["t2.weight"][299].cpu())
    assert states is not None and states.shape == (3,)
    c.begin_checkpoint()
    c.end_checkpoint(True)
    assert c.checkpoint_bytes() >= 0 and isinstance(c.replicated_across_ranks(), bool)

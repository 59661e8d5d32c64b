"""Every placement trains the same multi-hot model as --placement device (issue 38): bags of
several ids per feature (some empty), sum pooling, DLRM-dot and DLRM-DCN, 200 steps.

Why the runs are bit-identical and not merely close: every placement pools each bag with the
same fused table-batched op over the bag's rows in the KJT's order (hot rows and staged cold rows
alike, through a remap), and each row's gradient is summed over its lookups in their original
order before its one update per step; a row staged from the host or the SSD tier is stored bit
for bit. So no summation order differs and the tolerance is 0 everywhere (FAE's device replica
runs PyTorch's update: see its test for the kernels it is compared with).
"""

import pytest
import torch

from dlrm import Trainer
from dlrm.data import DataSplits
from dlrm.pipelines.base import StepHook
from dlrm.pipelines.fae_batches import FAEBatchSource
from dlrm.pipelines.staging import HotlineTrainPipeline
from embeddings.hot_inputs import AllHotClassifier
from tests.dlrm.conftest import tiny
from tests.multi_hot_source import multi_hot_splits

STEPS = 200
BASE = dict(mini_batch_size=32, data_size=32 * STEPS, test_data_size=128,
            optimizer="adagrad", learning_rate=0.1, device="cpu", print_freq=100)  # fmt: skip
DCN = dict(arch_interaction_op="dcn", dcn_num_layers=2, dcn_low_rank_dim=3)
HOT = dict(hot_budget="4KB", profile_sample_rate=0.2)  # ~a fifth of the 607 rows with Adagrad
PLACEMENTS = {
    "host": dict(placement="host"),
    "fae": dict(placement="fae", fae_switch_period=4, **HOT),
    "hotline": dict(placement="hotline", **HOT),
    # popularity learned from the first 20 mini-batches' ids, then the plan adopted mid-run
    "hotline-learned": dict(placement="hotline", hotline_learn_batches=20, **HOT),
    # the SSD tier starts from --embedding-init hashed's values (as its reference below)
    "tiered": dict(
        placement="tiered", scm_cache="1KB", scm_io="buffered", embedding_init="hashed", **HOT
    ),  # fmt: skip
}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def train(tmp_path, name: str, data: DataSplits | None = None, **kw) -> tuple[Trainer, dict]:
    data = data if data is not None else multi_hot_splits(batch_size=32, steps=STEPS)
    trainer = Trainer(tiny(tmp_path / name, **{**BASE, **kw}), data=data)
    return trainer, trainer.fit()


@pytest.fixture(scope="module")
def device_runs(tmp_path_factory):
    """--placement device on the multi-hot data, trained once per (interaction, init)."""
    runs: dict[tuple, tuple[Trainer, dict]] = {}

    def get(interaction: str, init: str = "uniform") -> tuple[Trainer, dict]:
        key = (interaction, init)
        if key not in runs:
            arch = DCN if interaction == "dcn" else {}
            extra = {"embedding_init": init} if init != "uniform" else {}
            where = tmp_path_factory.mktemp(f"device-{interaction}-{init}")
            runs[key] = train(where, "run", placement="device", **arch, **extra)
        return runs[key]

    return get


def same_model(a: Trainer, b: Trainer) -> None:
    """Every table, optimizer state and dense weight bit-identical."""
    ea, eb = a.model.embeddings, b.model.embeddings
    for x, y in zip(ea.table_weights(), eb.table_weights(), strict=True):
        assert torch.equal(x, y)
    for x, y in zip(ea.optimizer_states(), eb.optimizer_states(), strict=True):
        assert (x is None) == (y is None) and (x is None or torch.equal(x, y))
    da, db = dict(a.model.named_parameters()), dict(b.model.named_parameters())
    assert sorted(da) == sorted(db) and all(torch.equal(da[k], db[k]) for k in da)


def test_the_source_is_multi_hot_with_empty_bags_and_replays():
    data = multi_hot_splits(batch_size=32, steps=3)
    a, b = data.train.batch(0, 1), data.train.batch(0, 1)
    assert torch.equal(a.sparse_features.values(), b.sparse_features.values())
    lengths = a.sparse_features.lengths().view(4, 32)
    assert set(lengths[0].tolist()) == {0, 3} and set(lengths[3].tolist()) == {0, 4}
    assert int(lengths.sum()) > 2 * 4 * 32  # far more than one id per feature


@pytest.mark.parametrize("interaction", ["dot", "dcn"])
@pytest.mark.parametrize("placement", ["host", "hotline", "hotline-learned", "tiered"])
@pytest.mark.usefixtures("long_training")
def test_every_placement_trains_the_device_placements_multi_hot_model(
    tmp_path, device_runs, placement, interaction
):
    arch = DCN if interaction == "dcn" else {}
    placed, summary = train(tmp_path, placement, **PLACEMENTS[placement], **arch)
    device, ref = device_runs(interaction, "hashed" if placement == "tiered" else "uniform")
    same_model(placed, device)
    assert summary["test_auc"] == ref["test_auc"] and summary["steps"] == ref["steps"] == STEPS
    p = summary["placement"]
    if placement == "hotline-learned":
        assert p["learned_batches"] == 20 and p["hot_rows"] > 0
    if placement != "host":  # both paths trained: popular inputs and staged cold rows
        assert isinstance(placed.pipeline, HotlineTrainPipeline)
        assert 0.05 < p["popular_input_share"] < 0.95 and p["cold_rows_per_batch"] > 0
    if placement == "tiered":  # the file behind the row cache was really used
        assert p["scm_cache_evictions"] > 0 and p["scm_rows_read"] > 0


@pytest.mark.parametrize(
    "interaction,backend,optimizer",
    [("dot", "torch", "adagrad"), ("dcn", "torch", "adagrad"), ("dot", "auto", "sgd")],
)
@pytest.mark.usefixtures("long_training")
def test_fae_trains_the_device_placements_multi_hot_model(
    tmp_path, interaction, backend, optimizer
):
    # FAE regroups each window's inputs into all-hot and cold mini-batches: the reference trains
    # on the very batches FAE trained on. FAE's device replica is updated by PyTorch ops (the
    # CUDA fbgemm wheel is not assumed); fbgemm's CPU Adagrad rounds its step otherwise (about
    # 2e-6 apart after 200 steps, one-hot data as well), so Adagrad is compared with
    # --embedding-backend torch on both sides, and fbgemm's kernels with SGD: bit-identical.
    arch = {**(DCN if interaction == "dcn" else {}), "embedding_backend": backend,
            "optimizer": optimizer}  # fmt: skip
    fae, summary = train(tmp_path, "fae", **PLACEMENTS["fae"], **arch)
    regrouped = fae.data.train
    assert isinstance(regrouped, FAEBatchSource)
    data = DataSplits(regrouped, fae.data.test, fae.data.table_sizes, fae.data.num_dense,
                      fae.data.feature_names)  # fmt: skip
    device, ref = train(tmp_path, "device", data, placement="device", **arch)
    same_model(fae, device)
    assert summary["test_auc"] == ref["test_auc"] and summary["steps"] == ref["steps"] == STEPS
    # both paths trained: all-hot batches on the replica, the others on the host
    p = summary["placement"]
    assert 0.05 < p["hot_input_share"] < 0.95 and p["hot_batches"] > 0 < p["cold_batches"]
    plan = fae.placement.plan
    hot = [_every_id_hot(b.sparse_features, plan) for b in regrouped.batches(0)]
    assert [
        bool(AllHotClassifier(plan)(b.sparse_features).all()) for b in regrouped.batches(0)
    ] == [bool(h.all()) for h in hot]
    assert 0 < sum(bool(h.all()) for h in hot) < len(hot)


def _every_id_hot(kjt, plan) -> torch.Tensor:
    """bool [inputs]: every id of every bag of the input is a hot row (an empty bag: vacuously),
    spelled out bag by bag, independently of embeddings/hot_inputs.py."""
    T, B = len(kjt.keys()), kjt.stride()
    hot_t, hot_r = plan.hot_ids()
    hot = set(zip(hot_t.tolist(), hot_r.tolist()))
    lengths, values = kjt.lengths().tolist(), kjt.values().tolist()
    out, pos = [True] * B, 0
    for t in range(T):
        for i in range(B):
            bag = values[pos : pos + lengths[t * B + i]]
            pos += len(bag)
            out[i] = out[i] and all((t, v) in hot for v in bag)
    return torch.tensor(out)


# --- Slipstream ---------------------------------------------------------------------------------

SLIP = dict(slipstream=True, slipstream_interval=6, slipstream_warmup=8, hot_budget="16KB",
            profile_sample_rate=0.2)  # fmt: skip


@pytest.mark.parametrize(
    "mode,placement,interaction",
    [("drop", "device", "dot"), ("freeze", "device", "dcn"), ("drop", "hotline", "dcn"),
     ("freeze", "tiered", "dot"), ("drop", "fae", "dcn")],
)  # fmt: skip
@pytest.mark.usefixtures("long_training")
def test_with_nothing_stale_slipstream_trains_the_multi_hot_model_unchanged(
    tmp_path, device_runs, mode, placement, interaction
):
    arch = DCN if interaction == "dcn" else {}
    where = {**PLACEMENTS.get(placement, {}), **SLIP}
    slip, summary = train(tmp_path, "slip", **where, **arch, slipstream_mode=mode,
                          slipstream_threshold=0.0)  # fmt: skip
    if placement == "fae":  # its own regrouped batches: FAE without Slipstream, same hot rows
        same_hot_rows = {k: SLIP[k] for k in ("hot_budget", "profile_sample_rate")}
        device, ref = train(tmp_path, "fae", **{**PLACEMENTS["fae"], **same_hot_rows}, **arch)
        assert 0 < ref["placement"]["hot_input_share"] < 1
    else:
        device, ref = device_runs(interaction, "hashed" if placement == "tiered" else "uniform")
    same_model(slip, device)
    assert summary["test_auc"] == ref["test_auc"] and summary["steps"] == STEPS
    s = summary["slipstream"]
    assert s["samples_skipped"] == s["emb_lookups_saved"] == 0 and s["stale_row_share"] == 0.0
    assert s["tracked_rows"] > 0 and s["snapshots"] == 1 + STEPS // 6


class Decisions:
    """Every decision of a drop-mode run, checked as it is taken against the tracker's stale
    set of that moment, bag by bag: an input is left out exactly when it has a lookup and every
    bag of it is stale (every row in the bag a stale tracked row; an empty bag: vacuously)."""

    def __init__(self, pipe) -> None:
        self.pipe, self.decide = pipe, pipe.stream.decide
        self.skipped = self.skipped_multi_id = self.kept = 0
        pipe.stream.decide = self

    def __call__(self, index, batch):
        decision = self.decide(index, batch)
        kjt, tr = batch.sparse_features, self.pipe.tracker
        stale_rows = set(zip(tr.tables[tr.stale.numpy()].tolist(),
                             tr.rows[tr.stale.numpy()].tolist()))  # fmt: skip
        T, B = len(kjt.keys()), kjt.stride()
        lengths, values = kjt.lengths().tolist(), kjt.values().tolist()
        every_bag_stale, any_lookup, longest = [True] * B, [False] * B, [0] * B
        pos = 0
        for t in range(T):
            for i in range(B):
                bag = values[pos : pos + lengths[t * B + i]]
                pos += len(bag)
                every_bag_stale[i] &= all((t, v) in stale_rows for v in bag)
                any_lookup[i] |= bool(bag)
                longest[i] = max(longest[i], len(bag))
        expected = [s and a for s, a in zip(every_bag_stale, any_lookup)]
        kept = decision[0] if isinstance(decision, tuple) else decision
        left_out = [False] * B if kept is None else (~kept).tolist()
        if self.pipe._active:
            assert left_out == expected
        self.skipped += sum(left_out)
        self.skipped_multi_id += sum(o and n > 1 for o, n in zip(left_out, longest))
        self.kept += B - sum(left_out)
        return decision


@pytest.mark.parametrize("placement", ["device", "hotline"])
@pytest.mark.usefixtures("long_training")
def test_drop_leaves_out_exactly_the_inputs_whose_every_bag_is_stale(tmp_path, placement):
    cfg = tiny(tmp_path / placement, **{**BASE, **PLACEMENTS.get(placement, {}), **SLIP,
               "slipstream_mode": "drop", "slipstream_target_skip": 0.3, "data_size": 32 * 60,
               "nepochs": 2})  # fmt: skip
    trainer = Trainer(cfg, data=multi_hot_splits(batch_size=32, steps=60))
    seen = Decisions(trainer.pipeline)
    summary = trainer.fit()
    s = summary["slipstream"]
    assert s["samples_trained"] + s["samples_skipped"] == 2 * 32 * 60
    assert s["samples_skipped"] > 0 and seen.skipped >= s["samples_skipped"]
    assert seen.skipped_multi_id > 0  # bags of several ids, all stale, were left out


@pytest.mark.parametrize("placement", ["device", "hotline"])
@pytest.mark.usefixtures("long_training")
def test_freeze_keeps_every_stale_row_of_a_bag_as_it_was(tmp_path, placement):
    class Watch(StepHook):
        frozen_changed = frozen_checked = 0

        def attach(self, trainer) -> None:
            self.pipe = trainer.pipeline

        def step(self, batch, run):
            pipe, tr = self.pipe, self.pipe.tracker
            if not pipe._active:
                return run()
            ids = (torch.from_numpy(tr.tables), torch.from_numpy(tr.rows))
            before = pipe.coll.rows_of(*ids)[0]
            loss = run()
            after = pipe.coll.rows_of(*ids)[0]
            self.frozen_checked += int(tr.stale.sum())
            self.frozen_changed += int((before != after).any(1)[tr.stale].sum())
            return loss

    watch = Watch()
    cfg = tiny(tmp_path / "freeze", **{**BASE, **PLACEMENTS.get(placement, {}), **SLIP,
               "slipstream_mode": "freeze",
               "slipstream_target_skip": 0.3, "data_size": 32 * 60})  # fmt: skip
    trainer = Trainer(cfg, data=multi_hot_splits(batch_size=32, steps=60), step_hook=watch)
    s = trainer.fit()["slipstream"]
    assert s["samples_skipped"] == 0 and s["lookups_frozen"] > 0
    assert watch.frozen_checked > 0 and watch.frozen_changed == 0


@pytest.mark.gpu
@pytest.mark.parametrize("placement", ["hotline", "tiered"])
def test_on_cuda_the_staged_placements_train_the_device_placements_multi_hot_model(
    tmp_path, placement
):
    init = {"embedding_init": "hashed"} if placement == "tiered" else {}
    device, a = train(tmp_path, "device", placement="device", device="cuda", **init)
    placed, b = train(tmp_path, placement, **{**PLACEMENTS[placement], "device": "cuda"})
    for x, y in zip(
        device.model.embeddings.table_weights(), placed.model.embeddings.table_weights()
    ):
        # CUDA sums a bag's rows and a row's gradients in its own order
        assert float((x.cpu() - y.cpu()).abs().max() / y.abs().max()) <= 1e-5
    assert round(a["test_auc"], 4) == round(b["test_auc"], 4)

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from dlrm import Trainer
from dlrm.pipelines.fae_batches import BatchSelector, FAEBatchSource, concat_batches
from dlrm.train import main
from embeddings.hot_inputs import AllHotClassifier
from embeddings.hot_rows import PlacementPlan

# a budget of about a quarter of the tiny model's rows: some inputs hot, some cold
FAE = dict(
    placement="fae", hot_budget="2KB", profile_sample_rate=0.2, fae_switch_period=4, device="cpu"
)


def sample_key(batch):
    """One hashable row per input: its ids (one per feature) and its label."""
    ids = batch.sparse_features.values().view(len(batch.sparse_features.keys()), -1).T
    return [tuple(r) + (float(lbl),) for r, lbl in zip(ids.tolist(), batch.labels.tolist())]


@pytest.mark.usefixtures("long_training")
def test_fae_training_reports_placement_and_counters(make_config):
    cfg = make_config(**FAE, optimizer="rowwise_adagrad")
    trainer = Trainer(cfg)
    emb = trainer.model.embeddings
    assert emb.placement_info()["kind"] == "fae" and 0 < emb.num_hot < 607
    assert isinstance(trainer.data.train, FAEBatchSource)
    summary = trainer.fit()
    p = summary["placement"]
    assert p["kind"] == "fae" and p["device_tier_bytes"] <= 2048
    assert 0 < p["hot_input_share"] < 1 and p["hot_batches"] + p["cold_batches"] == 30
    assert p["emb_bytes_h2d"] == p["emb_bytes_h2d_lookup"] + p["emb_bytes_h2d_sync"] > 0
    assert p["syncs"] > 0 and p["emb_bytes_d2h_sync"] > 0
    assert {"hot_s", "cold_s"} <= set(summary["time_breakdown_s"])
    run = Path(cfg.out_dir)
    train_events = [
        json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"train"' in x
    ]
    assert train_events and all(
        "emb_bytes_h2d" in e and "hot_input_share" in e for e in train_events
    )
    assert {"hot_s", "cold_s", "sync_s", "syncs", "emb_bytes_d2h_sync"} <= set(train_events[-1])
    plan = PlacementPlan.load(run / "placement_plan.npz")
    assert plan.num_hot == emb.num_hot and (run / "placement_plan.json").is_file()
    assert (run / "access_profile.npz").is_file()


def test_fae_epoch_is_a_regrouping_of_the_same_inputs_and_replays_from_any_batch(make_config):
    trainer = Trainer(make_config(**FAE))
    fae, plain = trainer.data.train, trainer.data.train.source
    all_hot = AllHotClassifier(trainer.placement.plan)
    got = list(fae.batches(1))
    assert len(got) == len(fae) == len(plain) == 30
    assert sorted(k for b in got for k in sample_key(b)) == sorted(
        k for b in plain.batches(1) for k in sample_key(b)
    )
    kinds = [bool(all_hot(b.sparse_features).all()) for b in got]
    assert 0 < sum(kinds) < 30 and all(b.labels.numel() == 64 for b in got)
    tail = list(fae.batches(1, start=13))  # mid-window: what a resumed run sees
    assert len(tail) == 17
    for a, b in zip(tail + [fae.batch(1, 13)], got[13:] + [got[13]]):
        assert torch.equal(a.sparse_features.values(), b.sparse_features.values())
        assert torch.equal(a.dense_features, b.dense_features) and torch.equal(a.labels, b.labels)


@pytest.mark.usefixtures("long_training")
def test_fae_resume_reproduces_the_uninterrupted_run_exactly(make_config, tmp_path):
    for optimizer in ["sgd", "rowwise_adagrad"]:
        common = dict(FAE, test_freq=10, nepochs=2, data_size=64 * 15, optimizer=optimizer)
        full_cfg = make_config(
            **common, keep_checkpoints=10, out_dir=str(tmp_path / f"full-{optimizer}")
        )
        full = Trainer(full_cfg)
        full_summary = full.fit()
        cut = tmp_path / f"cut-{optimizer}"
        (cut / "checkpoints").mkdir(parents=True)
        shutil.copy(
            Path(full_cfg.out_dir) / "checkpoints" / "step_000000020.pt", cut / "checkpoints"
        )
        resumed = Trainer(
            make_config(**common, out_dir=str(cut), resume="auto")
        )  # re-profiles: same plan
        assert resumed.state.step == 20
        resumed_summary = resumed.fit()
        a, b = full.model.state_dict(), resumed.model.state_dict()
        for k in a:
            assert torch.equal(a[k], b[k]), k
        for sa, sb in zip(
            full.model.embeddings.optimizer_states(), resumed.model.embeddings.optimizer_states()
        ):
            assert (sa is None and sb is None) or torch.equal(sa, sb)
        for key in ["test_auc", "test_logloss", "steps", "samples"]:
            assert full_summary[key] == resumed_summary[key], key
        for key in ["emb_bytes_h2d", "emb_bytes_d2h", "syncs", "hot_input_share"]:
            assert full_summary["placement"][key] == resumed_summary["placement"][key], key


@pytest.mark.usefixtures("long_training")
def test_auto_placement_and_plan_reuse(make_config, tmp_path):
    small = Trainer(make_config(placement="auto", hot_budget="1GB", device="cpu"))
    assert small.model.embeddings.placement_info()["kind"] == "device"
    plan_file, profile_file = tmp_path / "plan.npz", tmp_path / "prof.npz"
    first = Trainer(
        make_config(
            **dict(FAE, placement="auto"),
            placement_plan=str(plan_file),
            profile_file=str(profile_file),
        )
    )
    assert first.model.embeddings.placement_info()["kind"] == "fae"
    assert plan_file.is_file() and profile_file.is_file()
    # reused as given, whatever the budget says now
    again = Trainer(
        make_config(
            **dict(FAE, hot_budget="1KB"),
            placement_plan=str(plan_file),
            out_dir=str(tmp_path / "r2"),
        )
    )
    assert again.model.embeddings.num_hot == first.model.embeddings.num_hot
    host = Trainer(make_config(placement="host", device="cpu", out_dir=str(tmp_path / "r3")))
    summary = host.fit()
    assert summary["placement"]["kind"] == "host" and summary["placement"]["hot_input_share"] == 0.0
    assert (
        summary["placement"]["emb_bytes_per_sample"] == 2 * 4 * 4 * 4
    )  # 4 pooled fp32 of width 4, both ways


def test_cli_placement_mistakes_are_one_line(make_config, tmp_path, capsys):
    base = ["--arch-embedding-size", "60-40-500-7", "--arch-sparse-feature-size", "4", "--arch-mlp-bot", "13-16-4",
            "--arch-mlp-top", "16-1", "--mini-batch-size", "64", "--data-size", "640", "--out-dir", str(tmp_path / "r")]  # fmt: skip
    for extra, message in [
        (["--hot-budget", "lots"], "--hot-budget: expected a size like 256MB"),
        (
            ["--placement", "gpu"],
            "--placement: expected one of device, host, fae, hotline, tiered, auto",
        ),
        (["--profile-sample-rate", "0"], "--profile-sample-rate: expected a number in (0, 1]"),
        (["--placement", "fae", "--placement-plan", str(tmp_path / "p.npz")], None),
    ]:
        if message is None:  # a plan made for another model
            other = make_config(**FAE, arch_embedding_size=(60, 40, 500, 8), placement_plan=str(tmp_path / "p.npz"),
                                out_dir=str(tmp_path / "o"))  # fmt: skip
            Trainer(other)
            message = "p.npz: made for other tables (table 3: 8 rows in the plan, 7 in the model)"
        assert main(base + extra) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err


def test_select_and_concat_batches_handle_jagged_features():
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    def batch(lengths, values, n):
        kjt = KeyedJaggedTensor(
            keys=["a", "b"],
            values=torch.tensor(values),
            lengths=torch.tensor(lengths, dtype=torch.int32),
            stride=n,
        )
        return Batch(
            dense_features=torch.arange(n, dtype=torch.float32)[:, None],
            sparse_features=kjt,
            labels=torch.arange(n, dtype=torch.float32),
        )

    x = batch([1, 0, 2, 1, 1, 0], [1, 2, 3, 4, 5], 3)  # a: [1] [] [2,3]; b: [4] [5] []
    y = batch([0, 3, 2, 0], [6, 7, 8, 9, 10], 2)  # a: [] [6,7,8]; b: [9,10] []
    both = concat_batches([x, y])
    assert both.sparse_features.stride() == 5
    assert [v.tolist() for v in both.sparse_features.to_dict()["a"].to_dense()] == [
        [1],
        [],
        [2, 3],
        [],
        [6, 7, 8],
    ]
    assert [v.tolist() for v in both.sparse_features.to_dict()["b"].to_dense()] == [
        [4],
        [5],
        [],
        [9, 10],
        [],
    ]
    sel = BatchSelector(both).select(np.array([4, 0, 3]))
    d = sel.sparse_features.to_dict()
    assert [v.tolist() for v in d["a"].to_dense()] == [[6, 7, 8], [1], []]
    assert [v.tolist() for v in d["b"].to_dense()] == [[], [4], [9, 10]]
    assert sel.labels.tolist() == [1.0, 0.0, 0.0] and sel.dense_features[:, 0].tolist() == [
        1.0,
        0.0,
        0.0,
    ]


def test_the_summary_says_where_the_plan_came_from(make_config, tmp_path):
    files = dict(profile_file=str(tmp_path / "p.npz"), placement_plan=str(tmp_path / "plan.npz"))
    first = Trainer(make_config(placement="fae", hot_budget="2KB", num_batches=4,
                                out_dir=str(tmp_path / "a"), **files)).fit()  # fmt: skip
    assert first["placement"]["plan_source"] == "made from a profile of the training data"
    again = Trainer(make_config(placement="fae", hot_budget="2KB", num_batches=4,
                                out_dir=str(tmp_path / "b"), **files)).fit()  # fmt: skip
    assert again["placement"]["plan_source"] == f"reused --placement-plan {tmp_path / 'plan.npz'}"
    from_profile = Trainer(make_config(placement="fae", hot_budget="2KB", num_batches=4,
                                       out_dir=str(tmp_path / "c"),
                                       profile_file=files["profile_file"])).fit()  # fmt: skip
    assert (
        from_profile["placement"]["plan_source"] == f"made from --profile-file {tmp_path / 'p.npz'}"
    )

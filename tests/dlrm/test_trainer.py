import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from dlrm import TrainConfig, Trainer
from dlrm.checkpoints import format as ckpt
from dlrm.config import ConfigError
from dlrm.errors import CheckpointError, TrainingDiverged
from tests.dlrm.conftest import assert_resumed_exactly


def weights(trainer):
    return {k: v.clone() for k, v in trainer.model.state_dict().items()}


@pytest.mark.usefixtures("long_training")
def test_fit_writes_run_directory_and_learns(make_config):
    cfg = make_config(data_size=64 * 240, test_freq=80, arch_mlp_top=(32, 1), optimizer="adagrad")
    summary = Trainer(cfg).fit()
    run = Path(cfg.out_dir)
    assert json.loads((run / "config.json").read_text())["mini_batch_size"] == 64
    on_disk = json.loads((run / "summary.json").read_text())
    for key in [
        "test_auc",
        "test_logloss",
        "test_accuracy",
        "test_ne",
        "train_samples_per_s",
        "steps",
        "wall_s",
    ]:
        assert on_disk[key] == summary[key]
    assert summary["steps"] == 240 and summary["samples"] == 240 * 64
    assert summary["test_auc"] > 0.6 and summary["test_ne"] < 1.0
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e["event"] == "eval"] == [80, 160, 240]
    assert sum(e["event"] == "train" for e in events) == 24
    assert [p.name for p in ckpt.list_checkpoints(run / "checkpoints")] == [
        "step_000000160.pt",
        "step_000000240.pt",
    ]


@pytest.mark.usefixtures("long_training")
def test_resume_reproduces_the_uninterrupted_run_exactly(make_config, tmp_path):
    for optimizer in ["sgd", "rowwise_adagrad"]:
        full_cfg = make_config(test_freq=10, nepochs=2, data_size=64 * 15, optimizer=optimizer,
                               keep_checkpoints=10, out_dir=str(tmp_path / f"full-{optimizer}"))  # fmt: skip
        full = Trainer(full_cfg)
        full_summary = full.fit()
        # "interrupted" after step 20 (mid second epoch): only that checkpoint survives
        cut = tmp_path / f"cut-{optimizer}"
        (cut / "checkpoints").mkdir(parents=True)
        shutil.copy(
            Path(full_cfg.out_dir) / "checkpoints" / "step_000000020.pt", cut / "checkpoints"
        )
        resumed_cfg = make_config(test_freq=10, nepochs=2, data_size=64 * 15, optimizer=optimizer,
                                  out_dir=str(cut), resume="auto")  # fmt: skip
        resumed = Trainer(resumed_cfg)
        assert resumed.state.step == 20 and resumed.state.epoch == 1
        resumed_summary = resumed.fit()
        assert_resumed_exactly(full, resumed, (full_summary, resumed_summary),
                               ["test_auc", "test_logloss", "test_accuracy", "test_ne", "steps",
                                "samples"])  # fmt: skip


@pytest.mark.usefixtures("long_training")
def test_fbgemm_and_torch_backends_train_identically(make_config, tmp_path):
    a = Trainer(make_config(embedding_backend="fbgemm", out_dir=str(tmp_path / "a")))
    b = Trainer(make_config(embedding_backend="torch", out_dir=str(tmp_path / "b")))
    sa, sb = a.fit(), b.fit()
    wa, wb = weights(a), weights(b)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-5, atol=1e-6)
    assert abs(sa["test_auc"] - sb["test_auc"]) < 1e-4


@pytest.mark.usefixtures("long_training")
def test_bf16_trains_like_fp32(make_config, tmp_path):
    kw = dict(optimizer="adagrad", data_size=64 * 300)
    fp32 = Trainer(make_config(**kw, out_dir=str(tmp_path / "fp32"))).fit()
    bf16 = Trainer(make_config(**kw, precision="bf16", out_dir=str(tmp_path / "bf16"))).fit()
    assert bf16["precision"] == "bf16" and bf16["test_auc"] > 0.58
    assert abs(bf16["test_auc"] - fp32["test_auc"]) < 0.02


def test_non_finite_loss_stops_and_keeps_last_checkpoint(make_config, monkeypatch):
    trainer = Trainer(make_config(test_freq=5))
    real = trainer.model.forward
    calls = {"n": 0}

    def poisoned(dense, sparse):
        out = real(dense, sparse)
        if not trainer.model.training:
            return out
        calls["n"] += 1
        return out * float("nan") if calls["n"] > 7 else out

    monkeypatch.setattr(trainer.model, "forward", poisoned)
    with pytest.raises(
        TrainingDiverged,
        match=r"non-finite loss \(nan\) at step 7.*last good checkpoint: .*step_000000005.pt",
    ):
        trainer.fit()
    saved = ckpt.list_checkpoints(Path(trainer.cfg.out_dir) / "checkpoints")
    assert [p.name for p in saved] == ["step_000000005.pt"]
    assert ckpt.load(saved[0])["train_state"]["step"] == 5


def test_crash_while_writing_a_checkpoint_leaves_the_previous_one(make_config, monkeypatch):
    trainer = Trainer(make_config(test_freq=5, data_size=64 * 12))
    real_save = torch.save

    def crashing_save(obj, f, *a, **kw):
        if obj["train_state"]["step"] == 10:
            f.write(b"partial garbage")
            raise OSError("disk full")
        return real_save(obj, f, *a, **kw)

    monkeypatch.setattr(torch, "save", crashing_save)
    with pytest.raises(
        CheckpointError, match=r"step_000000010.pt: could not write the checkpoint \(disk full\)"
    ):
        trainer.fit()
    directory = Path(trainer.cfg.out_dir) / "checkpoints"
    assert sorted(p.name for p in directory.iterdir()) == ["step_000000005.pt"]
    assert ckpt.load(directory / "step_000000005.pt")["train_state"]["step"] == 5


@pytest.mark.usefixtures("long_training")
def test_corrupt_or_foreign_checkpoints_are_refused(make_config, tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"\x80\x04not a zip")
    with pytest.raises(CheckpointError, match=re.escape(str(bad)) + ": not a readable checkpoint"):
        Trainer(make_config(resume=str(bad)))
    other = tmp_path / "other.pt"
    torch.save({"hello": torch.zeros(1)}, other)
    with pytest.raises(CheckpointError, match="not a hybrid-dlrm checkpoint"):
        Trainer(make_config(resume=str(other)))
    run = make_config(out_dir=str(tmp_path / "r1"))
    Trainer(run).fit()
    with pytest.raises(CheckpointError, match="written for a different model"):
        Trainer(make_config(resume=str(tmp_path / "r1"), arch_mlp_top=(8, 1)))
    nowhere = tmp_path / "nowhere"
    with pytest.raises(CheckpointError, match=f"--resume: {nowhere}: no checkpoint file or run"):
        Trainer(make_config(resume=str(nowhere)))


@pytest.mark.usefixtures("long_training")
def test_save_model_then_inference_only(make_config, tmp_path):
    model_file = tmp_path / "model.pt"
    trained = Trainer(make_config(save_model=str(model_file)))
    summary = trained.fit()
    again = Trainer(
        make_config(load_model=str(model_file), inference_only=True, out_dir=str(tmp_path / "inf"))
    )
    inf = again.fit()
    assert inf["steps"] == 0 and inf["stop_reason"] == "inference_only"
    assert inf["test_auc"] == summary["test_auc"]


def test_auc_threshold_stops_early(make_config):
    summary = Trainer(make_config(test_freq=5, mlperf_auc_threshold=0.01)).fit()
    assert summary["steps"] == 5 and summary["stop_reason"] == "auc_threshold"


@pytest.mark.usefixtures("long_training")
def test_readme_library_snippet_runs(tmp_path, monkeypatch):
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    block = re.search(r"```python\n(from dlrm import .*?)```", readme, re.S)
    assert block, "README has no library snippet"
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(block.group(1), "README.md", "exec"), namespace)
    assert namespace["summary"]["test_auc"] > 0.5
    assert (tmp_path / "runs" / "library-demo" / "summary.json").exists()


def test_config_round_trips_through_json(make_config):
    cfg = make_config(optimizer="adagrad", precision="bf16")
    assert TrainConfig.from_json(json.loads(json.dumps(cfg.to_json()))) == cfg


@pytest.mark.usefixtures("long_training")
def test_a_new_run_refuses_a_directory_holding_a_run(make_config):
    cfg = make_config()
    Trainer(cfg).fit()
    before = (Path(cfg.out_dir) / "metrics.jsonl").read_text()
    with pytest.raises(ConfigError, match="already holds a run; pass --resume"):
        Trainer(make_config())
    assert (Path(cfg.out_dir) / "metrics.jsonl").read_text() == before
    assert Trainer(make_config(resume="auto")).state.step == 30  # resuming it is fine


def test_default_run_directories_are_new(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a, b = TrainConfig(), TrainConfig()
    assert a.out_dir.startswith("runs/") and Path(a.out_dir) != tmp_path
    Path(a.out_dir).mkdir(parents=True)
    assert TrainConfig().out_dir != a.out_dir
    del b


def test_trainer_flushes_denormals_unless_told_not_to(make_config, tmp_path):
    tiny = torch.tensor([1e-39])  # a denormal float32
    try:
        Trainer(make_config(out_dir=str(tmp_path / "on")))
        assert (tiny * 1.0).item() == 0.0 and (tiny + 0.0).item() == 0.0
        Trainer(make_config(flush_denormal=False, out_dir=str(tmp_path / "off")))
        assert (tiny * 1.0).item() == pytest.approx(1e-39, rel=1e-3)
    finally:
        torch.set_flush_denormal(False)  # the process default, for the tests after this one


def test_the_trainer_is_only_the_loop():
    """Placement and process differences are decided where the run is built (dlrm/compose.py):
    no condition in dlrm/trainer.py reads a rank, a world size or a placement's kind."""
    import ast

    import dlrm.trainer

    tree = ast.parse(Path(dlrm.trainer.__file__).read_text())
    banned = {"rank", "world_size", "placement_info", "placement", "hotline", "tiered", "fae"}
    conditions = [n.test for n in ast.walk(tree) if isinstance(n, (ast.If, ast.IfExp, ast.While))]
    conditions += [v for n in ast.walk(tree) if isinstance(n, ast.BoolOp) for v in n.values]
    found = [
        ast.unparse(c)
        for c in conditions
        for n in ast.walk(c)
        if (isinstance(n, ast.Name) and n.id in banned)
        or (isinstance(n, ast.Attribute) and n.attr in banned)
        or (isinstance(n, ast.Constant) and n.value in banned)
    ]
    assert not found, found


def test_checkpoint_contents_are_listed_once(make_config):
    """Both stores take the checkpoint's dict from one CheckpointState: the single-file layout is
    its `whole()`, the sharded one's common part its `contents()` around the dense weights."""
    trainer = Trainer(make_config())
    whole = trainer.checkpoint_state()
    assert list(whole) == ["format", "version", "arch", "config", "model", "sparse_optimizer",
                           "embedding_extra", "dense_optimizer", "pipeline", "train_state",
                           "resume_files", "rng"]  # fmt: skip
    common = trainer._checkpoint().contents(table_prefix="embeddings.", dense_model={})
    assert set(common) - {"table_prefix", "dense_model"} == set(whole) - {
        "model",
        "sparse_optimizer",
    }


def test_a_resumed_run_says_where_it_resumes_from(make_config, capsys):
    cfg = make_config(num_batches=10, test_freq=5, keep_checkpoints=3)
    Trainer(cfg).fit()
    (cfg.run_dir / "checkpoints" / "step_000000010.pt").unlink()  # as if killed before it
    capsys.readouterr()
    Trainer(make_config(num_batches=10, test_freq=5, keep_checkpoints=3, resume="auto")).fit()
    said = [x for x in capsys.readouterr().out.splitlines() if x.startswith("resumed from ")]
    assert len(said) == 1, said
    assert said[0].endswith("step_000000005.pt at step 5 (epoch 1 of 1, batch 5)"), said

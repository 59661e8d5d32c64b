"""--placement tiered through the trainer: the same computation as --placement device (same
initial values with --embedding-init hashed), and crash-consistent: killed at any moment, a
resumed run ends with exactly the uninterrupted run's weights and metrics."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dlrm import Trainer
from dlrm.checkpoints import format as ckpt
from dlrm.errors import ConfigError
from dlrm.pipelines.staging import HotlineTrainPipeline
from dlrm.train import main
from embeddings.errors import ScmError
from embeddings.ssd.file import BLOCK, BlockFile
from embeddings.ssd.tier import ROWS, ScmTier

TIERED = dict(
    placement="tiered", hot_budget="2KB", profile_sample_rate=0.2, scm_cache="2KB",
    scm_io="buffered", device="cpu",
)  # fmt: skip
DEVICE = dict(placement="device", embedding_init="hashed", device="cpu")
# the tier's two ways home for the rows its cache evicts: each patched into its block at once (a
# 2 KB cache: too small for a write-back log), or appended to the log and swept home (a log needs
# two blocks of rows, 254 here, and a cache smaller than the tier: a larger table)
WRITE_BACK = {
    "patched": {"scm_cache": "2KB"},
    "logged": {"scm_cache": "24KB", "scm_log_share": 0.6, "arch_embedding_size": (60, 40, 5000, 7)},
}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def same_tables(a: Trainer, b: Trainer) -> None:
    """Every weight (dense and embedding) and optimizer state bit-identical."""
    ea, eb = a.model.embeddings, b.model.embeddings
    for x, y in zip(ea.table_weights(), eb.table_weights()):
        assert torch.equal(x, y)
    for x, y in zip(ea.optimizer_states(), eb.optimizer_states()):
        assert (x is None) == (y is None) and (x is None or torch.equal(x, y))
    da, db = dict(a.model.named_parameters()), dict(b.model.named_parameters())
    assert sorted(da) == sorted(db) and all(torch.equal(da[k], db[k]) for k in da)


@pytest.mark.parametrize(
    "optimizer,steps,io,way",
    [("adagrad", 200, "buffered", "patched"), ("sgd", 40, "direct", "patched"),
     ("rowwise_adagrad", 40, "buffered", "patched"), ("adagrad", 100, "direct", "logged")],
)  # fmt: skip
@pytest.mark.usefixtures("long_training")
def test_tiered_trains_like_the_device_placement(make_config, tmp_path, optimizer, steps, io, way):
    # Hotline's exactness argument holds with the SSD tier as the cold rows' home: each row,
    # hot or staged from the tier, gets one update per step from its summed gradient in the
    # fused op; the tier stores rows bit for bit (cache, file, initial values).
    common = dict(data_size=64 * steps, optimizer=optimizer, print_freq=50, learning_rate=0.1)
    common.update((k, v) for k, v in WRITE_BACK[way].items() if k == "arch_embedding_size")
    device = Trainer(make_config(**common, **DEVICE, out_dir=str(tmp_path / "device")))
    tiered_cfg = dict(TIERED, scm_io=io, **WRITE_BACK[way])
    tiered = Trainer(make_config(**{**common, **tiered_cfg}, out_dir=str(tmp_path / "tiered")))
    assert isinstance(tiered.pipeline, HotlineTrainPipeline)
    a, b = device.fit(), tiered.fit()
    same_tables(device, tiered)
    assert a["test_auc"] == b["test_auc"] and a["test_logloss"] == b["test_logloss"]
    p = b["placement"]
    assert p["kind"] == "tiered" and 0 < p["hot_rows"] < 607 + (way == "logged") * 4500
    assert p["scm_cache_evictions"] > 0 and p["scm_rows_read"] > 0  # the file was really used
    assert 0 < p["scm_cache_hit_rate"] < 1 and p["scm_writeback_bytes"] > 0
    assert p["scm_io_p50_us"] > 0 and p["scm_read_amplification"] >= 1
    if way == "logged":  # rows went home through the log's sweeps, and were read from the log
        assert p["scm_log_sweeps"] > 0 and p["scm_log_rows_swept"] > 0
        assert p["scm_log_rows_read"] > 0


@pytest.mark.usefixtures("long_training")
def test_tiered_with_sparse_plan_and_hashed_map_trains_like_the_device_placement(
    make_config, tmp_path, monkeypatch
):
    # the Terabyte-scale forms (the plan's sorted hot rows, Hotline's hashed id -> slot map),
    # forced on small tables: the same computation as the dense forms, so as --placement device
    import embeddings.hot_map
    import embeddings.hot_rows

    monkeypatch.setattr(embeddings.hot_map, "use_dense", lambda total, hot: False)
    monkeypatch.setattr(embeddings.hot_rows, "use_dense", lambda total, hot: False)
    common = dict(data_size=64 * 40, optimizer="rowwise_adagrad", print_freq=50, learning_rate=0.1)
    device = Trainer(make_config(**common, **DEVICE, out_dir=str(tmp_path / "device")))
    tiered = Trainer(make_config(**common, **TIERED, out_dir=str(tmp_path / "tiered")))
    emb = tiered.model.embeddings
    assert not emb.hot_map.dense and emb.plan.tier("device").remaps is None
    a, b = device.fit(), tiered.fit()
    same_tables(device, tiered)
    assert a["test_auc"] == b["test_auc"] and a["test_logloss"] == b["test_logloss"]
    assert b["placement"]["scm_cache_evictions"] > 0 and emb.plan.tier("device").remaps is None
    plan = json.loads((tmp_path / "tiered" / "placement_plan.json").read_text())
    assert plan["version"] == 3 and plan["tiers"][0]["form"] == "rows"


@pytest.mark.usefixtures("long_training")
def test_the_tier_files_layout_changes_where_rows_live_not_what_trains(make_config, tmp_path):
    # --scm-layout profile (the default where a profile exists) against row-id order and
    # against all rows in memory: bit-identical, the layout only moves rows between blocks
    common = dict(data_size=64 * 40, optimizer="rowwise_adagrad", print_freq=50, learning_rate=0.1)
    device = Trainer(make_config(**common, **DEVICE, out_dir=str(tmp_path / "device")))
    runs = {
        kind: Trainer(
            make_config(**common, **TIERED, scm_layout=kind, out_dir=str(tmp_path / kind))
        )  # fmt: skip
        for kind in ("profile", "identity")
    }
    a = device.fit()
    for kind, run in runs.items():
        b = run.fit()
        same_tables(device, run)
        assert a["test_auc"] == b["test_auc"] and a["test_logloss"] == b["test_logloss"]
        part = b["ssd_tier"]
        assert part["layout"] == kind and (part["layout_rows"] > 0) == (kind == "profile")
        assert b["placement"]["scm_rows_read"] > 0 and b["placement"]["scm_blocks_read"] > 0
        tier_json = json.loads((tmp_path / kind / "scm" / "tier.json").read_text())
        assert tier_json["row_layout"]["kind"] == kind


@pytest.mark.usefixtures("long_training")
def test_tiered_trains_tbsm_like_the_device_placement(make_config, tmp_path):
    from data_pipeline.taobao_synthetic import PlantedBehavior, write_user_behavior

    raw = tmp_path / "ub.csv"
    write_user_behavior(raw, PlantedBehavior(num_users=120, min_events=8, max_events=12, seed=2))
    common = dict(
        model="tbsm", data_set="taobao", raw_data_file=str(raw), ts_length=4, mini_batch_size=32,
        arch_embedding_size=None, arch_sparse_feature_size=None, arch_mlp_bot=None,
        arch_mlp_top=None, optimizer="adagrad",
    )  # fmt: skip
    device = Trainer(make_config(**common, **DEVICE, out_dir=str(tmp_path / "device")))
    tiered_cfg = dict(TIERED, hot_budget="16KB", scm_cache="16KB")
    tiered = Trainer(make_config(**common, **tiered_cfg, out_dir=str(tmp_path / "tiered")))
    a, b = device.fit(), tiered.fit()
    same_tables(device, tiered)
    assert a["test_auc"] == b["test_auc"]
    assert b["placement"]["scm_rows_read"] + b["placement"]["scm_rows_initial"] > 0


# --- crashes ---------------------------------------------------------------------------------------

RESUMABLE = dict(
    TIERED, optimizer="adagrad", nepochs=2, data_size=64 * 10, test_data_size=512, test_freq=5
)


@pytest.fixture(scope="module", params=sorted(WRITE_BACK))
def write_back(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def resumable(write_back) -> dict:
    return dict(RESUMABLE, **WRITE_BACK[write_back])


def eval_history(run_dir: Path) -> list[float]:
    events = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [e["test_auc"] for e in events if e["event"] == "eval"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, resumable, write_back):
    from tests.dlrm.conftest import tiny

    tmp = tmp_path_factory.mktemp("uninterrupted")
    trainer = Trainer(tiny(tmp, **resumable))
    summary = trainer.fit()
    p = summary["placement"]
    logged = p["scm_log_rows_swept"] if write_back == "logged" else p["scm_log_rows"]
    assert (logged > 0) == (write_back == "logged"), p  # the way home each variant names
    return trainer, summary, eval_history(trainer.run_dir)


class Crash(Exception):
    """Stands for kill -9: nothing after it runs (files are left as they are)."""


def _after_crash(make_config, tmp_path, uninterrupted, resumable) -> None:
    resumed = Trainer(make_config(**resumable, out_dir=str(tmp_path / "run"), resume="auto"))
    summary = resumed.fit()
    full, full_summary, full_evals = uninterrupted
    same_tables(full, resumed)
    for key in ["test_auc", "test_logloss", "steps", "samples"]:
        assert full_summary[key] == summary[key], key
    assert eval_history(tmp_path / "run") == full_evals and len(full_evals) == 4


@pytest.mark.parametrize("moment", ["mid_block_writes", "before_checkpoint_file", "before_commit"])
@pytest.mark.usefixtures("long_training")
def test_a_crash_at_any_moment_then_resume_ends_as_the_uninterrupted_run(
    make_config, tmp_path, monkeypatch, uninterrupted, resumable, moment
):
    """The three windows of a checkpoint interval: blocks half written (their pre-images
    journaled), the tier prepared but the checkpoint file not written, the checkpoint file
    written but the journal not restarted from it."""
    calls = {"n": 0, "commits": 0}
    if moment == "mid_block_writes":
        real, real_commit = BlockFile.write, ScmTier.commit

        def commit(self, generation):
            calls["commits"] += 1
            real_commit(self, generation)

        def write(self, blocks, buf):
            calls["n"] += calls["commits"] >= 2  # writes after the second checkpoint
            if calls["n"] >= 3 and len(blocks) > 1:
                half = len(blocks) // 2
                real(self, blocks[:half], buf[:half])
                raise Crash
            real(self, blocks, buf)

        monkeypatch.setattr(ScmTier, "commit", commit)
        monkeypatch.setattr(BlockFile, "write", write)
    elif moment == "before_checkpoint_file":
        real = ckpt.save

        def save(obj, path, what="checkpoint"):
            calls["n"] += 1
            if calls["n"] == 3:
                raise Crash
            real(obj, path, what)

        monkeypatch.setattr(ckpt, "save", save)
    else:
        real = ScmTier.commit

        def commit(self, generation):
            calls["n"] += 1
            if calls["n"] == 3:
                raise Crash
            real(self, generation)

        monkeypatch.setattr(ScmTier, "commit", commit)
    with pytest.raises(Crash):
        Trainer(make_config(**resumable, out_dir=str(tmp_path / "run"))).fit()
    monkeypatch.undo()
    _after_crash(make_config, tmp_path, uninterrupted, resumable)


def _cli_args(out_dir: Path) -> list[str]:
    return [
        "--arch-embedding-size", "60-40-500-7", "--arch-sparse-feature-size", "4",
        "--arch-mlp-bot", "13-16-4", "--arch-mlp-top", "16-1", "--mini-batch-size", "64",
        "--data-size", str(64 * 10), "--test-data-size", "512", "--learning-rate", "0.1",
        "--print-freq", "10", "--nepochs", "2", "--test-freq", "5", "--optimizer", "adagrad",
        "--placement", "tiered", "--hot-budget", "2KB", "--profile-sample-rate", "0.2",
        "--scm-cache", "2KB", "--scm-io", "buffered", "--device", "cpu", "--progress", "false",
        "--out-dir", str(out_dir),
    ]  # fmt: skip


def test_kill_9_during_training_then_resume_ends_as_the_uninterrupted_run(
    tmp_path, uninterrupted, resumable
):
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), OMP_NUM_THREADS="1")
    way = ["--scm-cache", resumable["scm_cache"]]
    if "scm_log_share" in resumable:
        sizes = "-".join(map(str, resumable["arch_embedding_size"]))
        way += ["--scm-log-share", str(resumable["scm_log_share"]), "--arch-embedding-size", sizes]
    cmd = [sys.executable, "-m", "dlrm.train", *_cli_args(out), *way]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:  # after the first checkpoint
        if metrics.is_file() and '"checkpoint"' in metrics.read_text():
            break
        time.sleep(0.05)
    time.sleep(random.Random(os.getpid()).uniform(0.0, 0.2))  # somewhere in the next interval
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL  # killed, not finished
    done = subprocess.run([*cmd, "--resume", "--save-model", str(tmp_path / "m.pt")], env=env)
    assert done.returncode == 0
    full, full_summary, full_evals = uninterrupted
    assert eval_history(out) == full_evals
    summary = json.loads((out / "summary.json").read_text())
    for key in ["test_auc", "test_logloss", "steps", "samples"]:
        assert full_summary[key] == summary[key], key
    weights = ckpt.load(tmp_path / "m.pt")["model"]
    # the killed run's tier was laid out by its profile, and resumed with that layout
    assert json.loads((out / "scm" / "tier.json").read_text())["row_layout"]["kind"] == "profile"
    reference = full.model.state_dict()  # full tables (not inside a checkpoint)
    assert sorted(weights) == sorted(reference)
    assert all(torch.equal(weights[k], reference[k]) for k in reference)


# --- what a user sees --------------------------------------------------------------------------


def test_a_damaged_tier_file_ends_a_resume_with_one_line_naming_it(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*_cli_args(out), "--nepochs", "1"]) == 0
    rows = out / "scm" / ROWS
    tier_map = ckpt.load(ckpt.list_checkpoints(out / "checkpoints")[-1])["model"]
    written = [k for k, v in tier_map.items() if k.endswith("scm_materialised")]
    block = int(torch.nonzero(tier_map[written[0]])[0, 0])
    with open(rows, "r+b") as f:
        f.seek(block * BLOCK + 7)
        f.write(b"\xff\xff")
    capsys.readouterr()
    assert main([*_cli_args(out), "--nepochs", "2", "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1 and f"rows.dat: block {block} at offset {block * BLOCK}: checksum" in err[0]
    )


def test_an_edited_tier_layout_ends_a_resume_with_one_line_naming_it(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*_cli_args(out), "--nepochs", "1"]) == 0
    layout = out / "scm" / "layout.npy"
    data = bytearray(layout.read_bytes())
    data[-1] ^= 1  # one row moved to another slot: its rows would be read from the wrong place
    layout.write_bytes(bytes(data))
    capsys.readouterr()
    assert main([*_cli_args(out), "--nepochs", "2", "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(
        "layout.npy: the tier's row layout does not match tier.json (checksum differs from its "
        "tier.json): its rows cannot be found without it (restore the file, or delete the "
        "directory to start the tier afresh)"
    ), err


def test_bad_tier_flags_are_one_line_each(make_config, tmp_path):
    with pytest.raises(ConfigError, match="--scm-io: expected one of direct, buffered"):
        make_config(**dict(TIERED, scm_io="mmap"))
    with pytest.raises(ConfigError, match="--embedding-init uniform: --placement tiered"):
        make_config(**TIERED, embedding_init="uniform")
    with pytest.raises(ConfigError, match="--scm-cache: expected a size"):
        make_config(**dict(TIERED, scm_cache="lots"))
    with pytest.raises(ConfigError, match="--scm-io-engine: expected one of auto, aio, threads"):
        make_config(**dict(TIERED, scm_io_engine="uring"))
    with pytest.raises(ConfigError, match="--scm-io-engine aio: needs --scm-io direct"):
        make_config(**dict(TIERED, scm_io="buffered", scm_io_engine="aio"))
    with pytest.raises(ConfigError, match="--scm-io-depth: expected an integer from 1 to 1024"):
        make_config(**dict(TIERED, scm_io_depth=0))
    first = make_config(**TIERED, out_dir=str(tmp_path / "a"), scm_dir=str(tmp_path / "scm"))
    Trainer(first)
    with pytest.raises(ConfigError, match=r"--scm-dir .*scm: holds the tier of the run in .*a;"):
        Trainer(make_config(**TIERED, out_dir=str(tmp_path / "b"), scm_dir=str(tmp_path / "scm")))


@pytest.mark.usefixtures("long_training")
def test_tier_counters_reach_metrics_jsonl_and_the_checkpoint_holds_no_cold_rows(
    make_config, tmp_path
):
    cfg = make_config(**TIERED, print_freq=10)
    trainer = Trainer(cfg)
    trainer.fit()
    events = [json.loads(x) for x in (Path(cfg.out_dir) / "metrics.jsonl").read_text().splitlines()]
    train = [e for e in events if e["event"] == "train"]
    assert {"scm_cache_hit_rate", "scm_read_amplification", "scm_io_p99_us"} <= set(train[-1])
    data = ckpt.load(ckpt.list_checkpoints(Path(cfg.out_dir) / "checkpoints")[-1])
    model = data["model"]
    assert not [k for k in model if k.endswith(".weight") and "embeddings" in k]
    hot = model["embeddings.tiered.hot_weight"]
    assert hot.shape[0] == trainer.model.embeddings.num_hot < 607
    assert data["sparse_optimizer"] == {}


@pytest.mark.gpu
def test_tiered_on_cuda_trains_like_the_device_placement(make_config, tmp_path):
    common = dict(data_size=64 * 60, optimizer="adagrad", print_freq=50)
    device = Trainer(
        make_config(**common, **dict(DEVICE, device="cuda"), out_dir=str(tmp_path / "d"))
    )
    tiered = Trainer(
        make_config(**common, **dict(TIERED, device="cuda"), out_dir=str(tmp_path / "t"))
    )
    a, b = device.fit(), tiered.fit()
    for x, y in zip(
        device.model.embeddings.table_weights(), tiered.model.embeddings.table_weights()
    ):
        assert float((x.cpu() - y.cpu()).abs().max() / y.abs().max()) <= 1e-5  # CUDA's own order
    assert round(a["test_auc"], 4) == round(b["test_auc"], 4)
    assert b["placement"]["scm_rows_read"] > 0


# --- issue 37: the tier's directory and its disk ----------------------------------------------


@pytest.mark.parametrize("where", ["a file", "below a file"])
def test_a_scm_dir_that_cannot_be_a_directory_is_one_line(tmp_path, capsys, where):
    (tmp_path / "f").write_text("x")
    scm = tmp_path / "f" if where == "a file" else tmp_path / "f" / "scm"
    assert main([*_cli_args(tmp_path / "run"), "--num-batches", "2", "--scm-dir", str(scm)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--scm-dir: {scm} " in err[0], err


def fill_after_first_checkpoint(monkeypatch, disk: Path) -> None:
    """The file system at `disk` filled up as soon as the SSD tier commits its first
    checkpoint."""
    real = ScmTier.commit

    def commit(self, generation):
        real(self, generation)
        if generation == 1:
            _fill(disk)

    monkeypatch.setattr(ScmTier, "commit", commit)


def _fill(disk: Path) -> None:
    """Every free byte of the file system at `disk` taken by one file."""
    with open(disk / "filler", "wb") as f:
        try:
            while True:
                f.write(bytes(1 << 16))
                f.flush()
        except OSError:
            pass


def test_a_full_disk_under_the_tier_is_one_line_and_the_last_checkpoint_resumes(
    make_config, tmp_path, tmpfs, monkeypatch, uninterrupted, resumable
):
    # item 11: the disk fills up after the first checkpoint; the run ends in one line naming the
    # file system, and once there is room again it resumes from that checkpoint, exactly
    disk = tmpfs("size=2m")
    cfg = dict(resumable, scm_dir=str(disk / "scm"))
    fill_after_first_checkpoint(monkeypatch, disk)
    with pytest.raises(ScmError) as e:
        Trainer(make_config(**cfg, out_dir=str(tmp_path / "run"))).fit()
    msg = str(e.value)
    assert "\n" not in msg and f"no space left on the file system mounted at {disk}" in msg, msg
    monkeypatch.undo()
    (disk / "filler").unlink()
    resumed = Trainer(make_config(**cfg, out_dir=str(tmp_path / "run"), resume="auto"))
    summary = resumed.fit()
    full, full_summary, full_evals = uninterrupted
    same_tables(full, resumed)
    assert all(full_summary[k] == summary[k] for k in ["test_auc", "test_logloss", "steps"])

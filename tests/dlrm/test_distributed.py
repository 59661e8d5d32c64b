"""Multi-process training (2 CPU processes over gloo) against one process at the same global
batch: for each sharding kind gloo runs, per-step losses within 1e-5 relative, final weights
within 1e-5, test AUC equal to 4 decimals; sharded checkpoints resume across world sizes (2 -> 1
and 1 -> 2); a killed rank ends the job with a message naming it.

One pair of processes (`_ranks`) runs every 2-process job in turn, so torchrec is imported once."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dlrm.checkpoints import format as ckpt
from perfmodel.collectives import CollectiveCounter
from tests.dlrm.conftest import tiny

STEPS = 12
# (name, settings): one per sharding kind gloo runs, each with another fused optimizer
KINDS = {
    "table_wise": dict(sharding="table_wise", optimizer="sgd"),
    "column_wise": dict(
        sharding="column_wise",
        optimizer="adagrad",
        sharding_min_columns=4,
        arch_sparse_feature_size=8,
        arch_mlp_bot=(13, 16, 8),
    ),  # fmt: skip
    "data_parallel": dict(sharding="data_parallel", optimizer="rowwise_adagrad"),
}
RESUMED = dict(sharding="table_wise", optimizer="adagrad", test_freq=STEPS // 2)
# --placement fae with 2 ranks: hot rows replicated, cold rows table-wise; trains what RESUMED's
# one process trains (--placement device), as the batches are not regrouped
HOT = dict(
    RESUMED, placement="fae", hot_budget="3KB", profile_sample_rate=1.0
)  # 96 rows: 4 floats + Adagrad state
HOT_HOTLINE = dict(HOT, placement="hotline")  # the same split across ranks


def config(out_dir: Path, **kw):
    return tiny(
        out_dir.parent, out_dir=str(out_dir), num_batches=STEPS, print_freq=1, learning_rate=0.05,
        test_data_size=1024, keep_checkpoints=3, **kw,
    )  # fmt: skip


def result(cfg) -> dict:
    """What a run is compared by: per-step losses, final weights (every table whole), test AUC."""
    from dlrm.trainer import Trainer

    trainer = Trainer(cfg, dist.get_rank() if dist.is_initialized() else 0,
                      dist.get_world_size() if dist.is_initialized() else 1)  # fmt: skip
    summary = trainer.fit()
    state = {k: v.clone() for k, v in trainer.model.state_dict().items()}  # collective
    events = [json.loads(x) for x in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = {e["step"]: e["loss"] for e in events if e["event"] == "train"}
    return {"state": state, "losses": losses, "auc": summary["test_auc"]}


def _ranks(rank: int, init: str, root: str) -> None:
    from dlrm.errors import CheckpointError, ConfigError

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        root_dir = Path(root)
        jobs = {name: config(root_dir / f"two_{name}", **kw) for name, kw in KINDS.items()}
        jobs["resumed_1_to_2"] = config(root_dir / "one_to_two", **RESUMED, resume="auto")
        jobs["two_resumable"] = config(root_dir / "two_resumable", **RESUMED)
        # resumed at its end: nothing trained or written (issue 37, 4)
        jobs["two_finished"] = config(root_dir / "two_resumable", **RESUMED, resume="auto")
        jobs["hot_replicated"] = config(root_dir / "two_hot", **HOT)
        jobs["hot_replicated_hotline"] = config(root_dir / "two_hotline", **HOT_HOTLINE)
        # one process's FAE and Hotline checkpoints resumed by two (issue 37)
        jobs["fae_1_to_2"] = config(root_dir / "fae_1_to_2", **HOT, resume="auto")
        jobs["hotline_1_to_2"] = config(root_dir / "hotline_1_to_2", **HOT_HOTLINE, resume="auto")
        for name, cfg in jobs.items():
            with CollectiveCounter() as counter:
                try:
                    out = result(cfg)
                except (ConfigError, CheckpointError) as e:  # alike on every rank, before a step
                    out = {"error": str(e)}
                    if rank == 0:
                        torch.save(out, root_dir / f"{name}.pt")
                    dist.barrier()
                    continue
            out["sent"] = json.dumps(counter.per_step(1))
            if rank == 0:
                torch.save({**out, "losses": json.dumps(out["losses"])}, root_dir / f"{name}.pt")
            dist.barrier()  # nothing of this job in flight when the next starts or the group goes
    finally:
        dist.destroy_process_group()


def _load(path: Path) -> dict:
    got = torch.load(path, weights_only=True)
    if "error" in got:
        return got
    got["losses"] = {int(k): v for k, v in json.loads(got["losses"]).items()}
    got["sent"] = json.loads(got["sent"])  # collectives of the whole run, by kind
    return got


def _cut_at(run: Path, step: int, to: Path) -> None:
    """A copy of `run` as if it had been stopped right after its checkpoint at `step`."""
    shutil.copytree(run, to)
    for p in (to / "checkpoints").iterdir():
        if int(p.name.split("_")[1].removesuffix(".pt")) > step:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    (to / "summary.json").unlink()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    one = {name: result(config(root / f"one_{name}", **kw)) for name, kw in KINDS.items()}
    one["resumable"] = result(config(root / "one_resumable", **RESUMED))
    _cut_at(root / "one_resumable", STEPS // 2, root / "one_to_two")
    for name, kw in (("fae", HOT), ("hotline", HOT_HOTLINE)):
        one[name] = result(config(root / f"one_{name}", **kw))
        _cut_at(root / f"one_{name}", STEPS // 2, root / f"{name}_1_to_2")
    mp.spawn(_ranks, args=(f"file://{root / 'rendezvous'}", str(root)), nprocs=2)
    names = [*KINDS, "resumed_1_to_2", "two_resumable", "two_finished", "hot_replicated",
             "hot_replicated_hotline", "fae_1_to_2", "hotline_1_to_2"]  # fmt: skip
    two = {name: _load(root / f"{name}.pt") for name in names}
    return root, one, two


def assert_same_run(one: dict, two: dict, first_step: int = 1) -> None:
    steps = [s for s in one["losses"] if s >= first_step]
    assert sorted(two["losses"]) == sorted(one["losses"]) and len(steps) >= STEPS // 2
    for s in steps:
        a, b = one["losses"][s], two["losses"][s]
        assert abs(a - b) <= 1e-5 * abs(a), (s, a, b)
    assert one["state"].keys() == two["state"].keys()
    for key, w in one["state"].items():
        torch.testing.assert_close(two["state"][key], w, rtol=0, atol=1e-5, msg=key)
    assert round(one["auc"], 4) == round(two["auc"], 4)


@pytest.mark.parametrize("kind", list(KINDS))
def test_two_processes_train_what_one_does(runs, kind):
    root, one, two = runs
    assert_same_run(one[kind], two[kind])
    plan = json.loads((root / f"two_{kind}" / "sharding_plan.json").read_text())
    assert {t["sharding"] for t in plan} == {kind}
    if kind == "column_wise":  # really split: two 4-column shards of each table, one per rank
        assert all([(s["rank"], s["sizes"][1]) for s in t["shards"]] == [(0, 4), (1, 4)]
                   for t in plan), plan  # fmt: skip
    # the weights moved (a run that trained nothing would also compare equal)
    start = tiny(root / "x")
    assert start.learning_rate > 0 and one[kind]["losses"][1] != one[kind]["losses"][STEPS]


def test_a_two_process_checkpoint_resumes_in_one_process(runs, tmp_path):
    root, one, two = runs
    written = root / "two_resumable" / "checkpoints" / f"step_{STEPS // 2:09d}"
    assert sorted(p.name for p in written.iterdir()) == [
        "index.json", "rank_00000-of-00002.pt", "rank_00001-of-00002.pt"
    ]  # fmt: skip
    assert_same_run(one["resumable"], two["two_resumable"])
    _cut_at(root / "two_resumable", STEPS // 2, tmp_path / "two_to_one")
    resumed = result(config(tmp_path / "two_to_one", **RESUMED, resume="auto"))
    assert_same_run(one["resumable"], resumed)


def test_a_finished_two_process_run_resumed_trains_and_writes_nothing(runs):
    root, _, two = runs
    again, first = two["two_finished"], two["two_resumable"]
    assert again["losses"] == first["losses"] and again["auc"] == first["auc"]
    for key, w in first["state"].items():
        assert torch.equal(again["state"][key], w), key
    events = (root / "two_resumable" / "metrics.jsonl").read_text()
    assert '"event": "resume"' not in events


def test_a_one_process_checkpoint_resumes_in_two(runs):
    root, one, two = runs
    assert_same_run(one["resumable"], two["resumed_1_to_2"])
    events = (root / "one_to_two" / "metrics.jsonl").read_text()
    assert '"event": "resume"' in events


def test_hot_rows_replicated_and_cold_rows_sharded_train_what_one_process_does(runs):
    """--placement fae with 2 ranks against --placement device in 1: same losses, weights, AUC;
    the hot rows' lookups stay on their rank and their gradients are all-reduced densely."""
    from dlrm.checkpoints import sharded as sharded_checkpoint

    root, one, two = runs
    assert_same_run(one["resumable"], two["hot_replicated"])
    plan = json.loads((root / "two_hot" / "sharding_plan.json").read_text())
    hot = {t["table"].removesuffix("_hot"): t["rows"] for t in plan if t["part"] == "hot"}
    cold = {t["table"].removesuffix("_cold"): t for t in plan if t["part"] == "cold"}
    sizes = dict(zip(["t_cat_0", "t_cat_1", "t_cat_2", "t_cat_3"], (60, 40, 500, 7)))
    assert sum(hot.values()) == 96 and all(
        hot.get(n, 0) + cold[n]["rows"] == sizes[n] for n in cold
    )
    assert [n for n in sizes if n not in cold] == ["t_cat_3"]  # all hot: no cold part
    assert {t["sharding"] for t in cold.values()} == {"table_wise"}
    assert {t["sharding"] for t in plan if t["part"] == "hot"} == {"data_parallel"}
    # what crossed ranks, against every table sharded table-wise on the same batches
    sent, everything = two["hot_replicated"]["sent"], two["two_resumable"]["sent"]
    hot_floats = sum(hot.values()) * 4
    assert sent["all_reduce_replicated_tables"]["payload_bytes"] == STEPS * hot_floats * 4
    assert "all_reduce_replicated_tables" not in everything
    assert sent["ids_all_to_all"]["wire_bytes"] < everything["ids_all_to_all"]["wire_bytes"]
    # its sharded checkpoint (hot rows from rank 0, cold shards by row ids) is the full tables
    state = sharded_checkpoint.assemble(root / "two_hot" / "checkpoints" / f"step_{STEPS:09d}")
    for key, w in two["hot_replicated"]["state"].items():
        if ".t_cat_" in key:
            assert torch.equal(state["model"][key], w), key


def test_hotline_across_ranks_replicates_the_same_hot_rows_and_trains_the_same_run(runs):
    root, one, two = runs
    assert_same_run(one["resumable"], two["hot_replicated_hotline"])
    plans = [json.loads((root / d / "sharding_plan.json").read_text())
             for d in ("two_hot", "two_hotline")]  # fmt: skip
    assert plans[0] == plans[1]
    sent = two["hot_replicated_hotline"]["sent"]
    assert (
        sent["all_reduce_replicated_tables"]
        == two["hot_replicated"]["sent"]["all_reduce_replicated_tables"]
    )


def test_hot_replicated_checkpoints_across_world_sizes(runs, tmp_path):
    """Issue 37: Hotline trains the batches in their order in one process and in several, so its
    checkpoints resume across world sizes (1 -> 2 was refused with "optimizer state does not
    fit"). FAE regroups the batches in one process only, so a checkpoint's data position names
    other samples in the other: refused in one line either way (2 -> 1 trained silently on)."""
    from dlrm.errors import ConfigError

    root, one, two = runs
    assert_same_run(one["resumable"], two["hotline_1_to_2"])
    _cut_at(root / "two_hotline", STEPS // 2, tmp_path / "hotline_2_to_1")
    resumed = result(config(tmp_path / "hotline_2_to_1", **HOT_HOTLINE, resume="auto"))
    assert_same_run(one["resumable"], resumed)
    _cut_at(root / "two_hot", STEPS // 2, tmp_path / "fae_2_to_1")
    with pytest.raises(ConfigError) as e:
        result(config(tmp_path / "fae_2_to_1", **HOT, resume="auto"))
    refusals = [str(e.value), two["fae_1_to_2"]["error"]]
    for said, (written, now) in zip(refusals, [(2, 1), (1, 2)]):
        assert f"was written by {written} process(es) and is resumed by {now}: not with " \
               "--placement fae" in said and "\n" not in said  # fmt: skip


def test_a_damaged_shard_is_named(runs, tmp_path):
    from dlrm.checkpoints import store as checkpoint_store
    from dlrm.errors import CheckpointError

    root, _, _ = runs
    step = root / "two_resumable" / "checkpoints" / f"step_{STEPS:09d}"
    copy = tmp_path / step.name
    shutil.copytree(step, copy)
    shard = copy / "rank_00001-of-00002.pt"
    weight = torch.load(shard, weights_only=True)["shards"][0]["weight"]
    data = bytearray(shard.read_bytes())
    data[data.find(weight.numpy().tobytes()) + 5] ^= 0x10  # one bit of a table's weights
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="rank_00001-of-00002.pt"):
        checkpoint_store.read(copy)
    index = copy / "index.json"
    index.write_text(index.read_text().replace('"step": 12', '"step": 13'))
    with pytest.raises(CheckpointError, match="index.json: corrupt"):
        checkpoint_store.read(copy)


def test_a_shard_from_another_checkpoint_is_refused_naming_it(runs, tmp_path):
    # Issue 37, 6: rank 1's file of the step-6 checkpoint copied into step 12's directory (same
    # size: the index's sizes cannot tell) was assembled, tables from step 6 under step 12's
    # state. Every shard carries its checkpoint's id, step and world size, as the index does.
    from dlrm.checkpoints import store as checkpoint_store
    from dlrm.errors import CheckpointError

    root, _, _ = runs
    run = root / "two_resumable" / "checkpoints"
    early, late = run / f"step_{STEPS // 2:09d}", run / f"step_{STEPS:09d}"
    name = "rank_00001-of-00002.pt"
    assert (early / name).stat().st_size == (late / name).stat().st_size
    mixed = tmp_path / late.name
    shutil.copytree(late, mixed)
    shutil.copy(early / name, mixed / name)
    with pytest.raises(CheckpointError) as e:
        checkpoint_store.read(mixed)
    assert str(e.value).startswith(f"{mixed / name}: ") and "\n" not in str(e.value)
    assert "another checkpoint" in str(e.value)
    # as --resume of the run directory: the mixed checkpoint is skipped, the one before is used
    cut = tmp_path / "cut"
    shutil.copytree(root / "two_resumable", cut)
    shutil.copy(early / name, cut / "checkpoints" / late.name / name)
    path, _ = checkpoint_store.resume_target("auto", cut)
    assert path.name == early.name


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_killed_rank_ends_the_job_with_a_message_naming_it(tmp_path):
    """Two ranks launched as torchrun would (its environment variables), rank 1 killed while
    training: rank 0 stops within seconds, naming rank 1, instead of hanging."""
    port = _free_port()
    args = [
        sys.executable, "-m", "dlrm.train", "--arch-embedding-size", "60-40-500-7",
        "--arch-sparse-feature-size", "4", "--arch-mlp-bot", "13-16-4", "--arch-mlp-top", "16-1",
        "--mini-batch-size", "64", "--data-size", str(64 * 100000), "--print-freq", "5",
        "--out-dir", str(tmp_path / "run"), "--dist-timeout", "60",
    ]  # fmt: skip
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
        procs.append(
            subprocess.Popen(
                args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    try:
        metrics = tmp_path / "run" / "metrics.jsonl"
        deadline = time.time() + 120
        while not (metrics.is_file() and '"train"' in metrics.read_text()):
            assert time.time() < deadline and procs[0].poll() is None, procs[0].communicate()
            time.sleep(0.2)
        procs[1].send_signal(signal.SIGKILL)
        killed = time.time()
        _, err = procs[0].communicate(timeout=60)
        took = time.time() - killed
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    last = err.strip().splitlines()[-1]
    assert procs[0].returncode == 1, err
    assert last.startswith("python -m dlrm.train: error: rank 0: lost contact with the other ranks")
    assert "stopped: rank 1 (no heartbeat for" in last, last
    assert took < 30, took


def test_ctrl_c_under_torchrun_each_rank_says_what_happened_and_exits_130(tmp_path):
    """Issue 46: a terminal's Ctrl-C reaches every rank (one process group, as under torchrun).
    Rank 1 reported "lost contact with the other ranks" and rank 0 a one-process resume
    command; now each rank says it was interrupted and where, rank 0 gives torchrun's command."""
    port, run = _free_port(), tmp_path / "run"
    args = [
        sys.executable, "-m", "dlrm.train", "--arch-embedding-size", "60-40-500-7",
        "--arch-sparse-feature-size", "4", "--arch-mlp-bot", "13-16-4", "--arch-mlp-top", "16-1",
        "--mini-batch-size", "64", "--data-size", str(64 * 100000), "--test-freq", "20",
        "--test-data-size", "128", "--print-freq", "0", "--out-dir", str(run),
    ]  # fmt: skip
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                   LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
        group = procs[0].pid if procs else 0  # one process group, as a terminal makes
        procs.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, process_group=group))  # fmt: skip
    try:
        deadline = time.time() + 240
        # a complete checkpoint: a shard directory appears before its files are all written
        while not ckpt.list_checkpoints(run / "checkpoints"):
            assert time.time() < deadline and procs[0].poll() is None, procs[0].communicate()
            time.sleep(0.1)
        os.killpg(procs[0].pid, signal.SIGINT)
        errs = [p.communicate(timeout=120)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [130, 130], errs
    lines = [e.strip().splitlines() for e in errs]
    assert all(len(x) == 1 for x in lines) and "Traceback" not in "".join(errs), errs
    zero, one = lines[0][0], lines[1][0]
    assert one.startswith("rank 1: interrupted at step ") and one.split()[-1].isdigit(), one
    assert zero.startswith("rank 0: interrupted at step ") and "; the last checkpoint is " in zero
    command = zero.split("resume with: ")[1]
    assert command.startswith("torchrun --standalone --nproc_per_node 2 -m dlrm.train ")
    assert command.endswith(f"--out-dir {run} --resume")


@pytest.mark.parametrize(
    "flags, message",
    [
        (dict(slipstream=True), "--slipstream: single-process only"),
        (dict(compile=True), "--compile: single-process only"),
        (dict(placement="tiered"), "--placement tiered: not with several processes"),
        (dict(placement="host"), "--placement host: not with several processes"),
        (dict(placement="hotline", hotline_learn_batches=5), "--hotline-learn-batches: not with"),
        (dict(mini_batch_size=63), "--mini-batch-size 63: the global batch must split evenly"),
    ],
)
def test_what_several_processes_cannot_run_is_refused_before_any_work(tmp_path, flags, message):
    from dlrm.errors import ConfigError
    from dlrm.trainer import Trainer

    cfg = tiny(tmp_path, **flags)
    with pytest.raises(ConfigError, match=message):
        Trainer(cfg, rank=0, world_size=2)  # refused before the process group is even used
    assert not (tmp_path / "run").exists()


def test_sharding_kinds_the_backend_cannot_run_are_named():
    from embeddings.sharded import ShardingError, allowed_shardings

    assert allowed_shardings("auto", "gloo", "sgd") == ["table_wise", "column_wise",
                                                        "data_parallel"]  # fmt: skip
    assert "row_wise" in allowed_shardings("auto", "nccl", "sgd")
    assert "column_wise" not in allowed_shardings("auto", "nccl", "rowwise_adagrad")
    with pytest.raises(ShardingError, match="--sharding row_wise: needs the nccl backend"):
        allowed_shardings("row_wise", "gloo", "adagrad")
    with pytest.raises(ShardingError, match="--sharding column_wise: not with --optimizer rowwise"):
        allowed_shardings("column_wise", "gloo", "rowwise_adagrad")
    with pytest.raises(ShardingError, match="--sharding: expected one of"):
        allowed_shardings("rows", "gloo", "sgd")

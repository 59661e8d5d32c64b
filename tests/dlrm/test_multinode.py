"""Multi-node launch, tried on one machine (issue 37): two torchrun invocations, one per "node"
(`--nnodes 2 --node-rank 0|1 --nproc_per_node 1`, a rendezvous endpoint on 127.0.0.1 at a free
port), train exactly what one `torchrun --nproc_per_node 2` does; killing one node ends the
other with the one-line message naming the rank that went silent.

Each launch starts Python, torch and torchrec in an agent and a worker per node, so these are
kept to three tiny runs, launched at once."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--arch-embedding-size", "60-40-500-7", "--arch-sparse-feature-size", "4",
        "--arch-mlp-bot", "13-16-4", "--arch-mlp-top", "16-1", "--mini-batch-size", "64",
        "--test-data-size", "512", "--test-mini-batch-size", "256", "--progress", "false",
        "--sharding", "table_wise", "--optimizer", "adagrad"]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(*args: str, log: Path) -> subprocess.Popen:
    """torchrun, its output to `log`."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", *args], cwd=ROOT, env=env,
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


def _node(rank: int, port: int, backend: str, *train: str, log: Path) -> subprocess.Popen:
    # read_timeout: on a loaded 2-core machine an agent can take longer than torchrun's default
    # 60 s to reach the store
    return _torchrun("--nnodes", "2", "--node-rank", str(rank), "--nproc_per_node", "1",
                     "--rdzv-backend", backend, "--rdzv-endpoint", f"127.0.0.1:{port}",
                     "--rdzv-conf", "read_timeout=300", "--rdzv-id", "i37", "-m", "dlrm.train",
                     *train, log=log)  # fmt: skip


def _nodes(port: int, backend: str, *train: str, logs: Path) -> list[subprocess.Popen]:
    """Node 0, then node 1 once node 0's store listens: both agents on 127.0.0.1 would try to
    host the store, and the one that loses the bind must find the other's already there."""
    first = _node(0, port, backend, *train, log=logs / "node0.log")
    deadline = time.time() + 240
    while first.poll() is None and time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.2)
    return [first, _node(1, port, backend, *train, log=logs / "node1.log")]


def _descendants(pid: int) -> list[int]:
    """The processes below `pid` (torchrun starts each worker in a session of its own)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    return [d for c in map(int, children) for d in (c, *_descendants(c))]


def _kill_node(p: subprocess.Popen) -> None:
    """SIGKILL to a node's agent and every process below it, as a machine that goes down."""
    for pid in [*_descendants(p.pid), p.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.wait()


def _finish(procs: list[subprocess.Popen], timeout: float) -> None:
    try:
        for p in procs:
            p.wait(timeout=timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                _kill_node(p)


def test_two_nodes_train_what_two_local_processes_do(tmp_path):
    train = [*TINY, "--data-size", str(64 * 12), "--test-freq", "6"]
    port = _free_port()
    nodes, two = tmp_path / "nodes", tmp_path / "two"
    procs = _nodes(port, "c10d", *train, "--out-dir", str(nodes), "--save-model",
                   str(tmp_path / "nodes.pt"), logs=tmp_path)  # fmt: skip
    _finish(procs, timeout=300)
    # then the local pair (not beside the nodes: four workers on two cores slow all of them)
    procs.append(_torchrun("--standalone", "--nproc_per_node", "2", "-m", "dlrm.train", *train,
                           "--out-dir", str(two), "--save-model", str(tmp_path / "two.pt"),
                           log=tmp_path / "two.log"))  # fmt: skip
    _finish(procs[-1:], timeout=300)
    logs = {p.name: p.read_text()[-3000:] for p in tmp_path.glob("*.log")}
    assert [p.returncode for p in procs] == [0, 0, 0], logs
    a, b = (json.loads((d / "summary.json").read_text()) for d in (nodes, two))
    for key in ("test_auc", "test_logloss", "test_accuracy", "steps", "samples"):
        assert a[key] == b[key], key
    assert a["steps"] == 12
    ma, mb = (torch.load(tmp_path / f, weights_only=True) for f in ("nodes.pt", "two.pt"))
    assert ma["model"].keys() == mb["model"].keys()
    for key, w in mb["model"].items():
        assert torch.equal(ma["model"][key], w), key
    # the checkpoints of both: one shard per rank, whichever node it ran on
    for d in (nodes, two):
        written = sorted(p.name for p in (d / "checkpoints" / f"step_{12:09d}").iterdir())
        assert written == ["index.json", "rank_00000-of-00002.pt", "rank_00001-of-00002.pt"]


def test_killing_one_node_ends_the_other_with_one_line(tmp_path):
    # static rendezvous: node-rank 0 is rank 0 (and hosts the store), node-rank 1 is rank 1
    port = _free_port()
    run = tmp_path / "run"
    train = [*TINY, "--data-size", str(64 * 100000), "--print-freq", "5", "--out-dir", str(run),
             "--dist-timeout", "60"]  # fmt: skip
    procs = _nodes(port, "static", *train, logs=tmp_path)
    try:
        metrics = run / "metrics.jsonl"
        deadline = time.time() + 240
        while not (metrics.is_file() and '"train"' in metrics.read_text()):
            assert time.time() < deadline and procs[0].poll() is None, (
                tmp_path / "node0.log"
            ).read_text()[-3000:]
            time.sleep(0.2)
        _kill_node(procs[1])
        killed = time.time()
        procs[0].wait(timeout=120)
        took = time.time() - killed
    finally:
        for p in procs:
            if p.poll() is None:
                _kill_node(p)
    log = (tmp_path / "node0.log").read_text()
    said = [x for x in log.splitlines() if x.startswith("python -m dlrm.train: error:")]
    assert procs[0].returncode != 0
    assert len(said) == 1, log[-3000:]
    assert said[0].startswith(
        "python -m dlrm.train: error: rank 0: lost contact with the other ranks; stopped: rank 1"
    ), said
    assert "Traceback" not in log.split(said[0])[0], log[-3000:]  # none from the worker
    assert took < 60, took

"""What the trainer guarantees once a process group exists (2 CPU processes over gloo): metrics
over ranks holding different numbers of samples equal the single-process metrics, and an
embedding collection whose per-process copies would drift apart (a single-process collection
given to the trainer) is refused. Training itself: tests/dlrm/test_distributed.py."""

from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dlrm.metrics import binary_metrics, gather_across_ranks

N = 1001  # odd: the two ranks hold 501 and 500 samples


def data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(N, generator=g), (torch.rand(N, generator=g) < 0.3).float()


def _rank(rank: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        logits, labels = data()
        mine = slice(0, 501) if rank == 0 else slice(501, N)
        gathered = gather_across_ranks(logits[mine].unsqueeze(1)).squeeze(1)
        metrics = binary_metrics(logits[mine], labels[mine])
        if rank == 0:
            torch.save({"gathered": gathered, "auc": metrics["auc"], "ne": metrics["ne"],
                        "samples": metrics["samples"]}, out)  # fmt: skip
    finally:
        dist.destroy_process_group()


def test_uneven_ranks_gather_every_sample_in_rank_order(tmp_path):
    out = tmp_path / "rank0.pt"
    mp.spawn(_rank, args=(f"file://{tmp_path / 'rendezvous'}", str(out)), nprocs=2, join=True)
    got = torch.load(out, weights_only=True)
    logits, labels = data()
    whole = binary_metrics(logits, labels)
    assert torch.equal(got["gathered"], logits)
    assert got["samples"] == N == whole["samples"]
    assert got["auc"] == whole["auc"] and abs(got["ne"] - whole["ne"]) < 1e-12


def _trainer_rank(rank: int, init: str, out_dir: str, result: str) -> None:
    from dlrm.build import build_model
    from dlrm.data import build_data
    from dlrm.errors import ConfigError
    from dlrm.trainer import Trainer
    from tests.dlrm.conftest import tiny

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        cfg = tiny(Path(out_dir) / str(rank))
        single = build_model(cfg, build_data(cfg, rank, 2), torch.device("cpu"))  # not sharded
        Trainer(cfg, rank=rank, world_size=2, model=single)
        message = "accepted"
    except ConfigError as e:
        message = str(e)
    finally:
        dist.destroy_process_group()
    with open(f"{result}.{rank}", "w") as f:
        f.write(message)


def test_a_collection_that_would_drift_across_processes_is_refused(tmp_path):
    result = tmp_path / "result"
    mp.spawn(
        _trainer_rank,
        args=(f"file://{tmp_path / 'rendezvous'}", str(tmp_path), str(result)),
        nprocs=2,
    )
    for rank in (0, 1):
        message = (tmp_path / f"result.{rank}").read_text()
        assert message.startswith(
            f"rank {rank}: this embedding placement keeps an independent copy"
        ), message

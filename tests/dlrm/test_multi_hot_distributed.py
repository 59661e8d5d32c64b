"""2-process training (gloo) on multi-hot bags against one process, as tests/dlrm/test_distributed.py
does for one id per feature: table-wise, column-wise and data-parallel sharding, and hot rows replicated with
cold rows sharded (FAE's and Hotline's split). Per-step losses within 1e-5 relative, final
weights within 1e-5 (the ranks' partial sums meet in another order), test AUC to 4 decimals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.dlrm.test_distributed import STEPS, _load, assert_same_run, config
from tests.multi_hot_source import multi_hot_splits

BATCH = 32
JOBS = {
    "table_wise": dict(sharding="table_wise", optimizer="adagrad"),
    "data_parallel": dict(sharding="data_parallel", optimizer="rowwise_adagrad"),
    "column_wise": dict(
        sharding="column_wise",
        optimizer="adagrad",
        sharding_min_columns=4,
        arch_sparse_feature_size=8,
        arch_mlp_bot=(13, 16, 8),
    ),  # fmt: skip
    # hot rows replicated on every rank, cold rows table-wise: trains what table_wise's one
    # process trains (--placement device), as the batches are not regrouped
    "fae": dict(
        sharding="table_wise",
        optimizer="adagrad",
        placement="fae",
        hot_budget="3KB",
        profile_sample_rate=1.0,
    ),  # fmt: skip
    "hotline": dict(
        sharding="table_wise",
        optimizer="adagrad",
        placement="hotline",
        hot_budget="3KB",
        profile_sample_rate=1.0,
    ),  # fmt: skip
}
REFERENCE = {"table_wise": "table_wise", "data_parallel": "data_parallel",
             "column_wise": "column_wise", "fae": "table_wise", "hotline": "table_wise"}  # fmt: skip


def result(cfg, rank: int = 0, world_size: int = 1) -> dict:
    from dlrm.trainer import Trainer

    data = multi_hot_splits(batch_size=BATCH, steps=STEPS, rank=rank, world_size=world_size)
    trainer = Trainer(cfg, rank, world_size, data=data)
    summary = trainer.fit()
    state = {k: v.clone() for k, v in trainer.model.state_dict().items()}  # collective
    events = [json.loads(x) for x in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = {e["step"]: e["loss"] for e in events if e["event"] == "train"}
    return {"state": state, "losses": losses, "auc": summary["test_auc"]}


def _cfg(root: Path, name: str, **kw):
    return config(root / name, mini_batch_size=BATCH, **kw)


def _ranks(rank: int, init: str, root: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        for name, kw in JOBS.items():
            out = result(_cfg(Path(root), f"two_{name}", **kw), rank, 2)
            out["sent"] = "{}"
            if rank == 0:
                torch.save({**out, "losses": json.dumps(out["losses"])}, Path(root) / f"{name}.pt")
            dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist_multi_hot")
    one = {n: result(_cfg(root, f"one_{n}", **JOBS[n])) for n in set(REFERENCE.values())}
    mp.spawn(_ranks, args=(f"file://{root / 'rendezvous'}", str(root)), nprocs=2)
    return root, one, {name: _load(root / f"{name}.pt") for name in JOBS}


@pytest.mark.parametrize("job", list(JOBS))
def test_two_processes_train_what_one_does_on_multi_hot_bags(runs, job):
    root, one, two = runs
    ref = one[REFERENCE[job]]
    assert_same_run(ref, two[job])
    assert ref["losses"][1] != ref["losses"][STEPS]  # it trained
    if job in ("fae", "hotline"):  # really split: hot rows replicated, cold rows sharded
        plan = json.loads((root / f"two_{job}" / "sharding_plan.json").read_text())
        assert {t["part"] for t in plan} == {"hot", "cold"}
    else:
        plan = json.loads((root / f"two_{job}" / "sharding_plan.json").read_text())
        assert {t["sharding"] for t in plan} == {job}

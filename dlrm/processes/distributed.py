"""Multi-process training on PyTorch's own stack: launched by torchrun, tables sharded by torchrec,
the dense part under DistributedDataParallel.

    torchrun --nproc_per_node 2 -m dlrm.train --mini-batch-size 2048 ...          # one machine
    torchrun --nnodes 2 --nproc_per_node 8 --rdzv-backend c10d \\
             --rdzv-endpoint HOST:29500 --rdzv-id job1 -m dlrm.train ...            # several

torchrun sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR; `init_from_env` starts the process
group from them (a plain `python -m dlrm.train` has none and stays one process). What each piece
does across ranks:

- data: `--mini-batch-size` is the global batch; rank r trains the r-th contiguous slice of every
  global batch (the batch sources shard it), so the LR policy and `--num-batches` count global
  steps and W processes see exactly the samples one process sees;
- tables: embeddings/sharded.py (torchrec's planner and DistributedModelParallel);
- dense part: `data_parallel` wraps the model in DDP for training steps (its gradients averaged
  over ranks; the tables are hidden from `.parameters()`, so DDP sees only the dense part);
- loss and metrics: the logged loss is the mean over ranks (the global batch's mean loss),
  evaluation gathers every rank's predictions (dlrm/metrics.py);
- a rank that dies or hangs: every collective has `--dist-timeout` as its deadline, and each
  rank writes a heartbeat to the process group's store every second, so the ranks still alive
  say which rank went silent (`failure_message`) instead of hanging.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from dlrm.config import TrainConfig
from dlrm.errors import ConfigError
from dlrm.placement.kinds import AUTO, all_kinds, placement_kind

log = logging.getLogger(__name__)

PLAN_TEXT = "sharding_plan.txt"
PLAN_JSON = "sharding_plan.json"
HEARTBEAT_S = 1.0


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def active() -> bool:
    """A process group of more than one rank is up."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def resolve_backend(name: str, device: str) -> str:
    if name == "auto":
        cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
        return "nccl" if cuda else "gloo"
    if name == "nccl" and not torch.cuda.is_available():
        raise ConfigError("--dist-backend nccl: needs CUDA devices; use gloo on CPU")
    return name


def init_from_env(cfg: TrainConfig) -> tuple[int, int]:
    """Join the process group torchrun describes; returns (rank, world size)."""
    backend = resolve_backend(cfg.distributed.dist_backend, cfg.training.device)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "nccl":
        torch.cuda.set_device(local_rank)  # "cuda" is then this rank's own device
    timeout = timedelta(seconds=cfg.distributed.timeout_s)
    store = _attempt_store(timeout)
    if store is None:
        dist.init_process_group(backend, timeout=timeout)
    else:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    Heartbeat.start(rank, world)
    log.info("rank %d of %d (%s)", rank, world, backend)
    return rank, world


def _attempt_store(timeout: timedelta):
    """Under torchrun's elastic agent, the rendezvous store of this attempt: the agent's store
    (or rank 0's) under a prefix naming the attempt. Without it, the workers restarted after a
    failure (`--max-restarts`) read the dead workers' gloo addresses from the same store and
    never connect ("Connection refused", measured with torch 2.13's static and c10d
    rendezvous). None outside torchrun's agent (plain env:// then)."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None or "MASTER_ADDR" not in os.environ:
        return None
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
        is_master=not agent and rank == 0, timeout=timeout, multi_tenant=not agent,
    )  # fmt: skip
    return dist.PrefixStore(f"hybrid-dlrm/attempt_{attempt}", store)


def first_attempt_resume(cfg: TrainConfig) -> TrainConfig:
    """`torchrun --max-restarts K ... --resume`: every attempt is launched with `--resume`, so the
    first one, which finds no run in `--out-dir` yet, starts it (elsewhere `--resume` of an
    empty directory is an error)."""
    restarts = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if restarts is None or cfg.run.resume != "auto" or (cfg.run_dir / "config.json").is_file():
        return cfg
    log.info("--resume: nothing in %s yet (attempt %s); starting the run", cfg.run_dir, restarts)
    return cfg.replace(resume=None)


def shutdown(finished: bool = False) -> None:
    """Leave the process group. `finished`: this rank's run ended normally, so every rank meets at
    a barrier first and no collective is still in flight on a worker thread when the group is
    destroyed (one 2-process test run, once in many, ended a rank with SIGABRT, "terminate called
    without an active exception", as the group went). After a failure nobody waits: the other
    ranks may be gone."""
    Heartbeat.stop()
    if dist.is_available() and dist.is_initialized():
        if finished:
            try:
                dist.barrier()
            except Exception:  # a rank that failed after its run: leave anyway
                pass
        dist.destroy_process_group()


def data_parallel(model: torch.nn.Module) -> torch.nn.Module:
    """The module a training step calls: `model` under DDP with a process group, else itself.
    Its buffers are constants (no broadcast needed); every dense parameter takes part in every
    step."""
    if not active():
        return model
    from torch.nn.parallel import DistributedDataParallel

    device = next(model.parameters()).device
    ids = [device] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, forward_sync_buffers=False)


@dataclasses.dataclass(frozen=True)
class Processes:
    """This process's place in the run, for the trainer's loop: what it asks instead of testing
    its rank (the composition root, dlrm/compose.py, picks what differs per rank)."""

    rank: int = 0
    world_size: int = 1

    def global_samples(self, samples: int) -> int:
        """The samples of a global step: every rank trains an equal slice of the global batch."""
        return samples * self.world_size

    def mean(self, value: torch.Tensor) -> float:
        return mean_across_ranks(value)


def mean_across_ranks(value: torch.Tensor) -> float:
    """The mean of a scalar over ranks (each rank's mean loss over its equal slice: the global
    batch's mean loss)."""
    if not active():
        return value.item()
    t = value.detach().float().reshape(1).clone()
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def write_plan(run_dir: Path, text: str, table: list[dict]) -> None:
    """The sharding plan, as torchrec prints it and as JSON, in the run directory (rank 0)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / PLAN_TEXT).write_text(text + "\n")
    (run_dir / PLAN_JSON).write_text(json.dumps(table, indent=1) + "\n")


# --- a rank that dies -----------------------------------------------------------------------------


class Heartbeat:
    """Every rank sets `heartbeat/<rank>` in the process group's store to the wall time, once a
    second, from a daemon thread. The store lives with rank 0 (or torchrun's agent), so when a
    collective fails the survivors can read who stopped beating."""

    _thread: threading.Thread | None = None
    _stop = threading.Event()
    _world = 1

    @classmethod
    def start(cls, rank: int, world: int) -> None:
        store = _store()
        if store is None or world == 1:
            return
        cls._world = world
        cls._stop.clear()

        def beat() -> None:
            while not cls._stop.is_set():
                try:
                    store.set(f"heartbeat/{rank}", repr(time.time()))
                except Exception:  # the store's host is gone: nothing left to report to
                    return
                cls._stop.wait(HEARTBEAT_S)

        cls._thread = threading.Thread(target=beat, name="heartbeat", daemon=True)
        cls._thread.start()

    @classmethod
    def stop(cls) -> None:
        cls._stop.set()
        cls._thread = None

    @classmethod
    def silent_ranks(cls, stale_s: float = 3 * HEARTBEAT_S) -> list[tuple[int, float]] | None:
        """Ranks whose last heartbeat is older than `stale_s`, with its age; None when the store
        cannot be read (rank 0, which hosts it, is the one that died)."""
        store = _store()
        if store is None:
            return None
        now, out = time.time(), []
        try:
            for r in range(cls._world):
                key = f"heartbeat/{r}"
                if not store.check([key]):
                    out.append((r, float("inf")))
                    continue
                age = now - float(store.get(key).decode())
                if age > stale_s:
                    out.append((r, age))
        except Exception:
            return None
        return out


def _store():
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:
        return None


def is_communication_failure(e: BaseException) -> bool:
    """An error from a collective whose peer is gone or too slow (gloo and NCCL raise these)."""
    if isinstance(e, getattr(dist, "DistError", ())):
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and any(
        s in text
        for s in ("Connection closed by peer", "Connection reset", "Timed out", "timed out",
                  "Broken pipe", "NCCL", "gloo", "Socket")
    )  # fmt: skip


def failure_message(e: BaseException, rank: int) -> str:
    """One line for a failed collective, naming the rank(s) that stopped: waits up to three
    heartbeats so a rank that just died shows as silent."""
    silent = None
    deadline = time.time() + 3.5 * HEARTBEAT_S
    while time.time() < deadline:
        silent = Heartbeat.silent_ranks()
        if silent is None or [r for r, _ in silent if r != rank]:
            break
        time.sleep(0.5)
    first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
    if silent is None:
        who = "rank 0 (it hosts the process group's store, which no longer answers)"
    elif [r for r, _ in silent if r != rank]:
        who = ", ".join(
            f"rank {r} (no heartbeat for {a:.1f} s)"
            if a != float("inf")
            else f"rank {r} (never seen)"
            for r, a in silent
            if r != rank
        )
    else:
        who = "no rank stopped beating: a rank is hung, or the network failed"
    return f"rank {rank}: lost contact with the other ranks; stopped: {who} [{first}]"


# --- the tables ------------------------------------------------------------------------------------


def sharded_embeddings(cfg: TrainConfig, tables, device: torch.device):
    """The collection of a multi-process run: every table sharded by torchrec's planner
    (`--sharding`), or with `--placement fae|hotline` the hot rows replicated and the cold rows
    sharded; the plan is logged, and written to the run directory by rank 0."""
    from dlrm.placement.run_plan import PlacedEmbeddings
    from embeddings.sharded import ShardedEmbeddingBagCollection, ShardingError

    opt = cfg.training.sparse_optimizer()
    min_columns = cfg.distributed.sharding_min_columns or None
    try:
        if _kind(cfg) is not None and _kind(cfg).multi_process == "hot_replicated":
            from embeddings.hot_replicated import HotReplicatedCollection

            hot = hot_rows(cfg, tables, opt)
            coll = HotReplicatedCollection(tables, opt, hot, device, cfg.distributed.sharding, cfg.training.seed,
                                           min_columns)  # fmt: skip
        else:
            coll = ShardedEmbeddingBagCollection(tables, opt, device, cfg.distributed.sharding, seed=cfg.training.seed,
                                                 min_column_shard=min_columns)  # fmt: skip
    except ShardingError as e:
        raise ConfigError(str(e)) from None
    if dist.get_rank() == 0:
        log.info("sharding plan:\n%s", coll.plan_text())
        write_plan(cfg.run_dir, coll.plan_text(), coll.plan_table())
    return PlacedEmbeddings(
        coll, cfg.placing.placement
    )  # the placement asked for; the plan is none


def hot_rows(cfg: TrainConfig, tables, opt) -> list:
    """Per table the hot rows (in slot order) of the placement plan one process would make: rank
    0 makes it (from `--placement-plan`, the run directory on resume, or a profile of the whole
    global batches under `--hot-budget`) and sends it to every rank."""
    import numpy as np

    from dlrm.data import build_data
    from dlrm.placement.run_plan import PlanFiles, obtain_plan
    from embeddings.errors import PlacementError, ProfileError

    counts = torch.full((len(tables),), -1, dtype=torch.int64)
    ids = torch.zeros(0, dtype=torch.int64)
    failure: Exception | None = None
    if dist.get_rank() == 0:
        try:
            whole = build_data(cfg, 0, 1).train  # every sample of the global batches
            one_home = _kind(cfg).one_home
            files = PlanFiles.of(cfg)
            plan = obtain_plan(cfg.placing, files, tables, opt, whole, one_home=one_home)
            table_of, rows = plan.hot_ids()
            counts = torch.as_tensor(np.bincount(table_of, minlength=len(tables)))
            ids = torch.as_tensor(rows)
        except (PlacementError, ProfileError, ConfigError) as e:
            failure = e
    dist.broadcast(counts, 0)  # -1: rank 0 could not make the plan (and says why)
    if failure is not None:
        raise ConfigError(str(failure)) from None
    if bool((counts < 0).any()):
        raise ConfigError(
            f"--placement {cfg.placing.placement}: rank 0 could not make the placement plan"
        )
    if dist.get_rank() != 0:
        ids = torch.empty(int(counts.sum()), dtype=torch.int64)
    dist.broadcast(ids, 0)
    return [part.numpy() for part in torch.split(ids, counts.tolist())]


def _kind(cfg: TrainConfig):
    """The run's placement kind (None: `auto`, which several processes run as device)."""
    name = cfg.placing.placement
    return None if name == AUTO else placement_kind(name)


def _either(names: list[str], word: str = "or") -> str:
    return ", ".join(names[:-1]) + f" {word} " + names[-1] if len(names) > 1 else "".join(names)


def check_supported(cfg: TrainConfig, world: int) -> None:
    """What several processes cannot run (yet): one line, before any work."""
    for flag, batch in (("--mini-batch-size", cfg.training.mini_batch_size),
                        ("--test-mini-batch-size", cfg.eval_batch_size)):  # fmt: skip
        if batch % world:
            raise ConfigError(
                f"{flag} {batch}: the global batch must split evenly over the {world} processes"
            )
    kind = _kind(cfg)
    if kind is not None and kind.multi_process is None:
        able = [k for k in all_kinds() if k.multi_process is not None]
        replicated = [k.name for k in able if k.multi_process == "hot_replicated"]
        raise ConfigError(
            f"--placement {cfg.placing.placement}: not with several processes (the tables are sharded "
            f"across them); use {_either([k.name for k in able])} ({_either(replicated, 'and')}: "
            "hot rows replicated, cold rows sharded)"
        )
    if kind is not None and kind.one_home and cfg.hotline.learn_batches:
        raise ConfigError(
            "--hotline-learn-batches: not with several processes (the hot rows replicated on "
            "every rank are fixed before training); give a profile or let the run profile"
        )
    if cfg.slipstreaming.enabled:
        raise ConfigError(
            "--slipstream: single-process only for now (which rows are stale would have to be "
            "agreed across ranks every interval)"
        )
    if cfg.training.compile:
        raise ConfigError(
            "--compile: single-process only for now (the compiled dense part under DDP is "
            "untested); leave it at auto, which trains eagerly with several processes"
        )


def resumable_with(cfg: TrainConfig, path: Path, data: dict, world: int) -> dict:
    """A checkpoint written by `data["world_size"]` processes (1 for a single file), as `world`
    processes resume it: the same run, or a ConfigError saying why not.

    Tables resume across any world sizes (dlrm/checkpoints/sharded.py). `--placement fae` does
    not between one process and several: one process regroups the batches into FAE's hot and
    cold mini-batches, several train them in their order, so the data position would name
    other samples. Hotline trains them in their order either way; the one-process transfer
    counters have no counterpart in the replicated placement and start again."""
    written = int(data.get("world_size", 1))
    if (written == 1) == (world == 1):
        return data
    if _kind(cfg) is not None and _kind(cfg).regroups_batches:
        raise ConfigError(
            f"--resume: {path} was written by {written} process(es) and is resumed by {world}: "
            f"not with --placement {cfg.placing.placement} (one process regroups the batches into FAE's schedule, "
            f"several do not); resume it with {'one process' if written == 1 else 'several'}"
        )
    if world > 1:
        extra = {k: v for k, v in data.get("embedding_extra", {}).items() if k != "placement_stats"}
        data = dict(data, embedding_extra=extra)
    return data


def check_replicated(embeddings, rank: int) -> None:
    """With a process group of several ranks, every rank runs its own copy of the collection:
    refuse collections whose copies would drift apart (each rank updating its rows with its own
    gradients), and so also never lose a rank's rows by checkpointing on rank 0 only."""
    if not active():
        return
    if not embeddings.replicated_across_ranks():
        raise ConfigError(
            f"rank {rank}: this embedding placement keeps an independent copy of the tables in every "
            "process, which would drift apart; multi-process training needs sharded tables"
        )

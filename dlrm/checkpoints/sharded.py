"""Sharded checkpoints: every rank writes the table shards it holds; any world size resumes.

    checkpoints/step_000000100/
        rank_00000-of-00002.pt   rank 0's shards, plus everything not sharded (dense weights and
                                 optimizer, train state, RNG, config: dlrm/checkpoints/store.py's
                                 CheckpointState without the tables)
        rank_00001-of-00002.pt   rank 1's shards
        index.json               written last, by rank 0, once every rank's file is complete

Each rank file is a checkpoint in the project's own format (dlrm/checkpoints/format.py: `torch.save` of
tensors and plain values, read with `weights_only=True`, a CRC-32 manifest verified on load),
so nothing here unpickles anything: torch.distributed.checkpoint was not used because its
reader unpickles its `.metadata` file. `index.json` lists the files with their sizes and the
tables' shapes, and carries a CRC-32 of its own body; a directory without it is an interrupted
save and is never resumed from (`checkpoint.list_checkpoints` skips it).

A shard is (table, first row, first column, weights, optimizer state), or with `rows` the row
ids its rows are (the hot and cold parts of embeddings/hot_replicated.py). `assemble` reads every
rank's file and puts each table back together, checking that the shards cover every element
exactly once, and returns the dict a single-process checkpoint holds (full tables under the
model's `<prefix><table>.weight` and `sparse_optimizer`). Resuming therefore works from any
world size to any other: one process loads the full tables, a sharded collection copies the
part each rank holds (embeddings/sharded.py). Every rank reads every file, which is fine for
the tables this runs on; at terabyte scale each rank would read only the shards overlapping
its own (docs/distributed.md: limits).

Every save draws a random checkpoint id (rank 0's, broadcast), written into the index and into
every rank's file with the step and the world size: a directory whose files come from different
saves (a shard copied in from another step or run, a rank's file left from an earlier attempt)
is refused naming the file, since each file on its own verifies.

A shared file system is assumed between nodes (every rank writes into the same directory).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from dlrm.checkpoints import format as ckpt
from dlrm.errors import CheckpointError
from embeddings.optimizer import SparseOptimizer
from hybrid_dlrm.common.atomic import write_json
from hybrid_dlrm.common.header import check_header
from hybrid_dlrm.common.manifest import Damaged, seal, unseal

INDEX = "index.json"
FORMAT = "hybrid-dlrm-sharded-checkpoint"
VERSION = 2  # 2: the checkpoint id in the index and every shard (1: none; still read)


def shard_name(rank: int, world: int) -> str:
    return f"rank_{rank:05d}-of-{world:05d}.pt"


def directory(ckpt_dir: Path, step: int) -> Path:
    return ckpt_dir / f"step_{step:09d}"


def _table_prefix(model: torch.nn.Module) -> str:
    for name, module in model.named_modules():
        if module is model.embeddings:
            return f"{name}."
    raise CheckpointError("the model holds no embedding collection")


def _dense_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict without the tables (which would be gathered whole)."""
    prefix = _table_prefix(model)
    out: dict[str, torch.Tensor] = {}
    for name, child in model.named_children():
        if child is model.embeddings:
            continue
        for key, value in child.state_dict().items():
            out[f"{name}.{key}"] = value
    if any(k.startswith(prefix) for k in out) or any(
        True for _ in model.named_parameters(recurse=False)
    ):
        raise CheckpointError("the model's layout is not children around one embedding collection")
    return out


def write(
    ckpt_dir: Path,
    step: int,
    rank: int,
    world: int,
    optimizer: str,
    keep: int,
    model: torch.nn.Module,
    common: Callable[..., dict],
) -> Path:
    """This rank's file of the checkpoint at `step` (every rank calls it); rank 0 then writes
    the index and prunes. `common(table_prefix=, dense_model=)`: the checkpoint's contents
    around the tables (dlrm/checkpoints/store.py's CheckpointState), taken on rank 0 only."""
    emb = model.embeddings
    out = directory(ckpt_dir, step)
    out.mkdir(parents=True, exist_ok=True)
    shards = []
    for s in emb.local_shards():
        if s.replicated and rank != 0:  # a data-parallel table: rank 0's copy is everyone's
            continue
        entry = {"table": emb.tables[s.table].name, "row0": s.row0, "col0": s.col0,
                 "weight": s.weight.detach()}  # fmt: skip
        if s.state is not None:
            entry["state"] = s.state.detach()
        if s.rows is not None:
            entry["rows"] = s.rows.detach().cpu()
        shards.append(entry)
    cid = _checkpoint_id()
    obj: dict = {"format": ckpt.FORMAT, "version": ckpt.VERSION, "shard_of": step,
                 "checkpoint_id": cid, "rank": rank, "world_size": world,
                 "shards": shards}  # fmt: skip
    if rank == 0:
        obj["common"] = common(table_prefix=_table_prefix(model), dense_model=_dense_state(model))
    path = out / shard_name(rank, world)
    ckpt.save(obj, path, what=f"checkpoint shard of rank {rank}")
    dist.barrier()  # every rank's file is complete before the index says so
    if rank == 0:
        _write_index(out, step, cid, world, optimizer, emb.tables)
        ckpt.prune(ckpt_dir, keep)
    return out


def _checkpoint_id() -> str:
    """Rank 0's random id for this save, on every rank (drawn from the OS, not torch's RNG, so
    the run's numbers do not depend on it)."""
    t = torch.tensor([secrets.randbits(62)], dtype=torch.int64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.broadcast(t, 0)
    return f"{int(t.item()):016x}"


def _write_index(out: Path, step: int, cid: str, world: int, optimizer: str, tables) -> None:
    files = []
    for r in range(world):
        p = out / shard_name(r, world)
        files.append({"name": p.name, "bytes": p.stat().st_size})
    body = {
        "format": FORMAT, "version": VERSION, "step": step, "checkpoint_id": cid,
        "world_size": world,
        "optimizer": optimizer, "files": files,
        "tables": {t.name: [t.num_embeddings, t.embedding_dim] for t in tables},
    }  # fmt: skip
    write_json(out / INDEX, seal(body))


def read_index(path: Path) -> dict:
    index = path / INDEX
    try:
        body = unseal(json.loads(index.read_text()))
    except Damaged as e:
        raise CheckpointError(f"{index}: corrupt: {e}") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(
            f"{index}: not a readable index of a sharded checkpoint ({e})"
        ) from None
    check_header(body, index, format=FORMAT, versions=(1, VERSION), kind="sharded checkpoint index",
                 what="sharded checkpoint index", error=CheckpointError)  # fmt: skip
    return body


def _check_belongs(shard: dict, index: dict, rank: int, file: Path) -> None:
    """`file` (verified on its own) is rank `rank`'s part of the save the index describes."""
    got = (shard.get("shard_of"), shard.get("world_size"), shard.get("checkpoint_id"))
    want = (index["step"], index["world_size"], index.get("checkpoint_id"))
    if got != want:
        raise CheckpointError(
            f"{file}: a shard of another checkpoint (step {got[0]}, {got[1]} processes, id "
            f"{got[2]}), not of this one (step {want[0]}, {want[1]} processes, id {want[2]}): "
            "the directory mixes the files of different saves"
        )
    if shard.get("rank") != rank:
        raise CheckpointError(f"{file}: holds the shards of rank {shard.get('rank')}, not {rank}")


def assemble(path: Path) -> dict:
    """The sharded checkpoint at `path` as one single-process checkpoint dict (full tables),
    every file verified; CheckpointError naming the file otherwise."""
    body = read_index(path)
    world = body["world_size"]
    tables = {name: tuple(shape) for name, shape in body["tables"].items()}
    weights = {name: torch.zeros(shape) for name, shape in tables.items()}
    kind = body["optimizer"]
    try:
        opt = SparseOptimizer(kind)
    except ValueError as e:
        raise CheckpointError(f"{path / INDEX}: {e}") from None
    states = {name: opt.zero_state(*shape) for name, shape in tables.items() if opt.has_state}
    covered = {name: torch.zeros(shape, dtype=torch.int32) for name, shape in tables.items()}
    common = None
    for r, entry in enumerate(body["files"]):
        file = path / entry["name"]
        if entry["name"] != shard_name(r, world):
            raise CheckpointError(f"{path / INDEX}: file {r} is {entry['name']!r}")
        if not file.is_file() or file.stat().st_size != entry["bytes"]:
            raise CheckpointError(f"{file}: missing or not the size its index records")
        data = ckpt.load(file)
        _check_belongs(data, body, r, file)
        if r == 0:
            common = data.get("common")
        for s in data["shards"]:
            name = s["table"]
            if name not in tables:
                raise CheckpointError(f"{file}: a shard of unknown table {name!r}")
            w = s["weight"]
            rows, cols = w.shape
            r0, c0 = s["row0"], s["col0"]
            if "rows" in s:  # explicit row ids
                at = s["rows"]
                outside = tuple(at.shape) != (rows,) or (
                    rows > 0 and (int(at.min()) < 0 or int(at.max()) >= tables[name][0])
                )
            else:
                at, outside = slice(r0, r0 + rows), r0 + rows > tables[name][0]
            if outside or c0 + cols > tables[name][1]:
                raise CheckpointError(f"{file}: a shard of {name} lies outside the table")
            weights[name][at, c0 : c0 + cols] = w
            covered[name][at, c0 : c0 + cols] += 1
            if name in states:
                if "state" not in s:
                    raise CheckpointError(f"{file}: a shard of {name} lacks its optimizer state")
                states[name][opt.state_index(at, c0, cols)] = s["state"]
    if common is None:
        raise CheckpointError(f"{path / shard_name(0, world)}: lacks the run's common state")
    for name, count in covered.items():
        if not bool((count == 1).all()):
            raise CheckpointError(
                f"{path}: the shards of table {name} do not cover it exactly once "
                f"({int((count == 0).sum())} elements missing, {int((count > 1).sum())} repeated)"
            )
    prefix = common["table_prefix"]
    model = dict(common["dense_model"])
    model.update({f"{prefix}{name}.weight": w for name, w in weights.items()})
    return {
        "format": ckpt.FORMAT,
        "version": ckpt.VERSION,
        "arch": common["arch"],
        "config": common["config"],
        "model": model,
        "sparse_optimizer": {f"{name}.{kind}_state": s for name, s in states.items()},
        "embedding_extra": common["embedding_extra"],
        "dense_optimizer": common["dense_optimizer"],
        "pipeline": common.get("pipeline", {}),  # absent from older files
        "train_state": common["train_state"],
        "resume_files": common.get("resume_files", {}),  # absent from older files
        "rng": common["rng"],
        "world_size": world,  # how many processes wrote it (dlrm/processes/distributed.py: resumable_with)
    }

"""Where a run's checkpoints go: one interface, `CheckpointStore`, with a single-file
implementation here (`FileCheckpoints`, dlrm/checkpoints/format.py's format), a sharded one
(`ShardedCheckpoints`, every rank writing its shards: dlrm/checkpoints/sharded.py's format) and
`NoCheckpoints` (benchmarks, and ranks that leave the writing to rank 0). The composition root
(dlrm/compose.py) picks one; the trainer only says when.

What a checkpoint holds is put together once, as a `CheckpointState` (the trainer's
`_checkpoint`); each store takes the parts its layout writes from it, so the contents are listed
in one place. Saving, loading, pruning and the last good checkpoint all go through the store;
`read` and `resume_target` read either layout (the two formats know nothing of each other).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dlrm.checkpoints import format as ckpt
from dlrm.checkpoints import sharded as sharded_checkpoint
from dlrm.errors import CheckpointError

log = logging.getLogger(__name__)

RESUME_FILES = "resume_files"  # a checkpoint's record of the files that steer a resume


def read(path: Path) -> dict:
    """The checkpoint at `path`, a file or a sharded checkpoint's directory (assembled into the
    single-process dict), verified; CheckpointError naming the file otherwise."""
    return sharded_checkpoint.assemble(path) if ckpt.is_sharded(path) else ckpt.load(path)


def nothing_to_resume(resume: str, run_dir: Path) -> Path | None:
    """The run directory `--resume` names when it holds no checkpoint to continue from: a run
    stopped before its first complete checkpoint, or before it wrote anything at all (no
    config.json yet; or no directory: a supervisor that always passes `--resume` starts a run
    this way). Such a run starts from the beginning: nothing was saved that could be continued,
    and refusing would stop a supervisor's retries for good. None: there is a checkpoint to
    continue from (or a file is named: it is loaded as it is). Another path than `--out-dir`
    that holds no run (missing, or empty: a mistyped path), or a finished run without a
    checkpoint, is a CheckpointError."""
    target = run_dir if resume == "auto" else Path(resume)
    if target.is_file() or ckpt.is_sharded(target):
        return None
    if ckpt.list_checkpoints(target / "checkpoints") or ckpt.list_checkpoints(target):
        return None
    ours = target.resolve() == run_dir.resolve()
    if not ours and not (target.is_dir() and any(target.iterdir())):
        raise CheckpointError(f"--resume: {target}: no checkpoint file or run directory there")
    if (target / "summary.json").is_file():
        raise CheckpointError(
            f"--resume: {target} holds a finished run that wrote no checkpoint to continue "
            "from; start a new run in another --out-dir"
        )
    return target


def resume_target(resume: str, run_dir: Path) -> tuple[Path, dict]:
    """`--resume` accepts a checkpoint file, a run directory, or `auto` (this run's directory).

    A file is loaded as it is (a corrupt one is an error). In a directory the newest checkpoint
    that verifies is used; corrupt newer ones are skipped with one warning naming them. A
    directory without any is `nothing_to_resume`'s, asked first (dlrm/compose.py)."""
    target = run_dir if resume == "auto" else Path(resume)
    if target.is_file() or ckpt.is_sharded(target):
        return target, read(target)
    directory = target / "checkpoints"
    if not ckpt.list_checkpoints(directory) and ckpt.list_checkpoints(target):
        directory = target  # a directory of checkpoints rather than a run directory
    if target.resolve() == run_dir.resolve():  # never another run's directory
        ckpt.remove_temporaries(directory)
    skipped: list[str] = []
    for path in reversed(ckpt.list_checkpoints(directory)):
        try:
            data = read(path)
        except CheckpointError as e:
            skipped.append(str(e))
            continue
        if skipped:
            log.warning(
                "--resume: skipped %d corrupt checkpoint(s) (%s); resuming from %s",
                len(skipped),
                "; ".join(skipped),
                path,
            )
        return path, data
    if skipped:
        raise CheckpointError(
            f"--resume: no checkpoint in {directory} verifies ({'; '.join(skipped)}); "
            "move them away to start the run again"
        )
    raise CheckpointError(f"--resume: no checkpoint in {directory}")


@dataclass
class CheckpointState:
    """Everything that decides the numbers of a resumed run. The model's part (weights and the
    sparse optimizer's state) is left to the store: a sharded store never gathers whole tables."""

    arch: dict
    config: dict  # what a resume must match (dlrm/run_checks.py)
    model: torch.nn.Module
    dense_optimizer: torch.optim.Optimizer
    pipeline: object  # a TrainPipeline (its own state: Slipstream's)
    train_state: dict
    step: int
    # what the files that steer a resume held (dlrm/resume_files.py): checked on --resume
    resume_files: dict = field(default_factory=dict)

    def contents(self, **model_part) -> dict:
        """The checkpoint's dict with `model_part` (the model's weights in the store's layout)."""
        return {
            "format": ckpt.FORMAT,
            "version": ckpt.VERSION,
            "arch": self.arch,
            "config": self.config,
            **model_part,
            "embedding_extra": self.model.embeddings.extra_state(),
            "dense_optimizer": self.dense_optimizer.state_dict(),
            "pipeline": self.pipeline.state_dict(),
            "train_state": self.train_state,
            RESUME_FILES: self.resume_files,
            "rng": ckpt.rng_state(),
        }

    def whole(self) -> dict:
        """A single-process checkpoint: every table whole, with its sparse optimizer state."""
        emb = self.model.embeddings
        return self.contents(
            model=self.model.state_dict(), sparse_optimizer=emb.sparse_state_dict()
        )


class CheckpointStore:
    """`save` writes one checkpoint (or nothing) and prunes; `load` reads either layout."""

    def __init__(self, directory: Path, keep: int = 1) -> None:
        self.directory, self.keep = directory, keep
        # the newest this process wrote or verified: not merely the newest file, as a resume may
        # have skipped corrupt newer ones
        self.last_good: Path | None = None

    def save(self, state: Callable[[], CheckpointState]) -> Path | None:
        """Take the state (only when this store writes) and write it; the path written, or None."""
        return None

    def resume_target(self, resume: str, run_dir: Path) -> tuple[Path, dict]:
        """`--resume`'s checkpoint with its verified contents (`resume_target`: a file, a run
        directory or `auto`)."""
        return resume_target(resume, run_dir)

    def load(self, path: Path) -> dict:
        """The checkpoint at `path` (a file or a sharded directory), verified."""
        return read(path)

    def resumed_from(self, path: Path) -> None:
        """The run continues from `path`: the last good checkpoint until the next is written."""
        self.last_good = path


class NoCheckpoints(CheckpointStore):
    """Writes none: `checkpoints=False`, or a rank whose run rank 0 writes whole."""


class FileCheckpoints(CheckpointStore):
    """One file per checkpoint (dlrm/checkpoints/format.py), the newest `keep` kept."""

    def save(self, state: Callable[[], CheckpointState]) -> Path | None:
        taken = state()
        path = ckpt.checkpoint_path(self.directory, taken.step)
        written = False
        try:
            ckpt.save(taken.whole(), path)
            written = True
        finally:
            taken.model.embeddings.end_checkpoint(written)
        self.last_good = path
        ckpt.prune(self.directory, self.keep)
        return path


class ShardedCheckpoints(CheckpointStore):
    """Every rank writes the shards it holds; rank 0 then writes the index and prunes."""

    def __init__(self, directory: Path, keep: int, rank: int, world: int, optimizer: str) -> None:
        super().__init__(directory, keep)
        self.rank, self.world, self.optimizer = rank, world, optimizer

    def save(self, state: Callable[[], CheckpointState]) -> Path | None:
        """Every rank: write this rank's file; rank 0 then writes the index. The directory."""
        taken = state()
        written = False
        try:
            out = sharded_checkpoint.write(self.directory, taken.step, self.rank, self.world,
                                           self.optimizer, self.keep, taken.model,
                                           taken.contents)  # fmt: skip
            written = True
        finally:
            taken.model.embeddings.end_checkpoint(written)
        self.last_good = out
        return out

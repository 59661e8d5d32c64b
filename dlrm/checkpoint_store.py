"""Where a run's checkpoints go: one interface, `CheckpointStore`, with a single-file
implementation here (`FileCheckpoints`, dlrm/checkpoint.py's format), a sharded one
(dlrm/sharded_checkpoint.py's `ShardedCheckpoints`, every rank writing its shards) and
`NoCheckpoints` (benchmarks, and ranks that leave the writing to rank 0). The composition root
(dlrm/compose.py) picks one; the trainer only says when.

What a checkpoint holds is put together once, as a `CheckpointState` (the trainer's
`_checkpoint`); each store takes the parts its layout writes from it, so the contents are listed
in one place. Saving, loading, pruning and the last good checkpoint all go through the store.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from dlrm import checkpoint as ckpt


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

    def resume_target(self, resume: str, run_dir: Path) -> tuple[Path, dict] | None:
        """`--resume`'s checkpoint with its verified contents (dlrm/checkpoint.py's
        `resume_target`: a file, a run directory or `auto`); None: start the run afresh."""
        return ckpt.resume_target(resume, run_dir)

    def load(self, path: Path) -> dict:
        """The checkpoint at `path` (a file or a sharded directory), verified."""
        return ckpt.load(path)

    def resumed_from(self, path: Path) -> None:
        """The run continues from `path`: the last good checkpoint until the next is written."""
        self.last_good = path


class NoCheckpoints(CheckpointStore):
    """Writes none: `checkpoints=False`, or a rank whose run rank 0 writes whole."""


class FileCheckpoints(CheckpointStore):
    """One file per checkpoint (dlrm/checkpoint.py), the newest `keep` kept."""

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

"""Staging: the part of the collection contract a train pipeline uses to bring a mini-batch's rows
in before its step, as torchrec's `ShardedModule.prefetch`.

A collection that stages (embeddings/staged/collection.py: hot rows on the device, cold rows in a row store)
is trained by the staging pipeline (dlrm/pipelines/staging.py), which per mini-batch:
1. notes the collection's `version` (write-backs so far) on the step's thread, then runs
   `stage(features, inputs, version)` mini-batches ahead, on a worker: it only reads;
2. runs the step inside `using(staged, waited_s)`: the rows loaded where the step looks them up,
   the previous step's rows written home first, and any staged row written back after the worker
   read it renewed (it yields how many); when the step ends it is counted with the time it waited
   for the worker (`waited_s`).
So a step crosses into the collection three times besides its lookup: `version`, `stage`, `using`.
A collection may also offer `renewal(since)` (optional: the pipeline asks with getattr): called on
the step's thread right after a write-back, for a staging made at version `since` still in
flight, it returns what the worker runs after that staging to read the rows written back since
(or None), so that `using` renews only the rows of the write-back that follows.

A collection may also learn which rows are hot while it trains (Hotline's online popularity): with
no `plan` yet, `observe(features)` counts accesses and `adopt(plan)` moves the plan's hot rows in.

The pipeline is chosen by `stages(collection)`, never by the collection's kind.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class StagingCollection(Protocol):
    """What the staging pipeline asks of a collection (besides the collection contract)."""

    version: int  # write-backs so far: a staging made at an older version is renewed when used
    plan: Any  # the placement plan; None while popularity is being learned
    learned_batches: int  # mini-batches observed while learning popularity

    def stage(self, features, inputs: int | None = None, version: int | None = None) -> Any:
        """One mini-batch's rows read for its step (thread-safe: it only reads)."""
        ...

    def using(self, staged, waited_s: float | None = None) -> AbstractContextManager[int]:
        """A training step on the mini-batch `staged` was made for; yields the rows renewed.
        With `waited_s`, the seconds the step waited for `staged`, the step is counted."""
        ...

    def sync(self) -> None:
        """Every staged row home (before anything reads the rows' homes)."""
        ...

    def observe(self, features) -> None:
        """Count this mini-batch's accesses (while `plan` is None)."""
        ...

    def adopt(self, plan) -> None:
        """Move `plan`'s hot rows in (after learning popularity)."""
        ...


def stages(collection) -> bool:
    """Does `collection` stage its rows per mini-batch (and so want the staging pipeline)?"""
    return isinstance(collection, StagingCollection)

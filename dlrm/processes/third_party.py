"""Third-party warnings a multi-process run prints that are harmless here, silenced one by one
on their exact message and module; anything else still shows.

Each was checked against tests/dlrm/test_distributed.py's equivalence tests
(`test_two_processes_train_what_one_does[table_wise|column_wise|data_parallel]`: two processes
train exactly what one process does, every step's loss and every final weight within 1e-5,
through torchrec's planner and DistributedModelParallel), which would fail were any of them
about something that changes the numbers:

- fbgemm's "dense_embedding_codegen_lookup_function: an autograd kernel was not registered ...
  may lead to silently incorrect behavior": the op of data-parallel tables (torchrec's dense
  kernel) is registered for the CPU key and builds its own autograd function inside, so
  PyTorch's fallback warns although the backward runs fbgemm's gradient. The `data_parallel`
  case of the test trains it and matches one process's fused tables to 1e-5.
- torchrec's DistributedDataParallel of data-parallel lookups: "`broadcast_buffers` is
  deprecated": a renamed argument; those lookups have no buffers.
- torchrec's planner: "The topology was constructed directly ..." (dlrm/processes/distributed.py builds
  the CPU/gloo topology itself: there is no accelerator to resolve), the
  HeuristicalStorageReservation FutureWarning and "known issue with ... dense tensor size ... in
  dry run" (estimates of device memory, which bound the plan's choice, never its numbers; the
  plans the tests check are the ones asked for), "Sharding spec not found for ..." (its rank
  check finds no shards in a data-parallel table: it is replicated whole) and "Sharding Type is
  data_parallel, caching params will be ignored" (there is no cache on CPU).
"""

from __future__ import annotations

import logging
import warnings

# (logger, the message's start, the file that logs it: a root-logger message is told by its file)
_LOGGED = (
    ("torchrec.distributed.planner.types", "The topology was constructed directly", None),
    ("torchrec.distributed.planner.storage_reservations",
     "There is a known issue with TorchRec's dense tensor size calculation", None),
    ("torchrec.distributed.utils", "Sharding Type is data_parallel, caching params will be "
     "ignored", None),
    ("", "Sharding spec not found for ", "torchrec/distributed/planner/planners.py"),
)  # fmt: skip


class _Drop(logging.Filter):
    def __init__(self, start: str, path: str | None) -> None:
        super().__init__()
        self.start, self.path = start, path

    def filter(self, record: logging.LogRecord) -> bool:
        if self.path is not None and not record.pathname.replace("\\", "/").endswith(self.path):
            return True
        return not record.getMessage().startswith(self.start)


_done = False


def silence_harmless() -> None:
    """Install the filters (once per process; idempotent)."""
    global _done
    if _done:
        return
    _done = True
    warnings.filterwarnings(
        "ignore",
        message=r"fbgemm::dense_embedding_codegen_lookup_function: an autograd kernel was not "
        r"registered",
        category=UserWarning,
        module=r"torch\.autograd\.graph",
    )
    warnings.filterwarnings(
        "ignore", message=r"`broadcast_buffers` is deprecated", category=FutureWarning,
        module=r"torchrec\.distributed\.embeddingbag",
    )  # fmt: skip
    warnings.filterwarnings(
        "ignore", message=r"HeuristicalStorageReservation is known to cause issues",
        category=FutureWarning, module=r"torchrec\.distributed\.planner\.planners",
    )  # fmt: skip
    for name, start, path in _LOGGED:
        logging.getLogger(name).addFilter(_Drop(start, path))

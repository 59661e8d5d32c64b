"""Processes and threads: torchrun's ranks on PyTorch's own stack (`distributed`), how many threads a
run computes on (`threads`) and how that count follows the machine's load (`thread_watch`), and the
third-party warnings a multi-process run silences (`third_party`).
"""

from hybrid_dlrm.common.lazy import lazy_exports

_HOME = {
    "Processes": "dlrm.processes.distributed",
    "sharded_embeddings": "dlrm.processes.distributed",
    "CpuSampler": "dlrm.processes.thread_watch",
}

__all__ = sorted(_HOME)
__getattr__, __dir__ = lazy_exports(__name__, _HOME)

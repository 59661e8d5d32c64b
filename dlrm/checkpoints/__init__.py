"""Checkpoints: one interface, `CheckpointStore`, over a single file per step (`format`: written
atomically, verified when read, read without pickle) and per-rank shards (`sharded`) that any
world size resumes from.
"""

from hybrid_dlrm.common.lazy import lazy_exports

_HOME = {
    "CheckpointStore": "dlrm.checkpoints.store",
    "CheckpointState": "dlrm.checkpoints.store",
    "FileCheckpoints": "dlrm.checkpoints.store",
}

__all__ = sorted(_HOME)
__getattr__, __dir__ = lazy_exports(__name__, _HOME)

"""What the ranks one launcher started on one machine say once between them.

Every rank of `python -m dlrm.torchrun` parses the same flags and starts at the same moment, so a
bad flag fails every rank, and whichever fails first makes the launcher stop the others (SIGTERM),
often while they still import torch. The user should read the error once, from whichever rank got
there first, and nothing from a rank the launcher stopped for that: it was not interrupted by
anyone.

The launcher makes a directory its ranks share (LAUNCH_DIR_ENV). A rank that fails creates
`failed` there with O_EXCL before it exits: the one that creates it says why; the others, and a
rank stopped while starting once the file exists, say nothing. The launcher sees a rank's exit
only after the file was made, so a rank it stops always finds it. Under plain `torchrun` (no
directory) local rank 0 speaks, which can leave the error unsaid if another rank failed first:
that launcher's own traceback then names the failing rank.
"""

from __future__ import annotations

import os

LAUNCH_DIR_ENV = "HYBRID_DLRM_LAUNCH_DIR"
FAILED = "failed"


def _shared() -> str | None:
    """The launcher's directory, for a rank it started (LOCAL_RANK set): a command run outside
    a launcher with the variable left in its environment speaks for itself."""
    return os.environ.get(LAUNCH_DIR_ENV) if "LOCAL_RANK" in os.environ else None


def first_to_fail() -> bool:
    """Record that this rank fails; True where it is the rank (of those sharing a launcher's
    directory) that should say why."""
    where = _shared()
    if not where:
        return os.environ.get("LOCAL_RANK", "0") == "0"
    try:
        os.close(os.open(os.path.join(where, FAILED), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    except OSError:  # the directory is gone (the launcher was killed): fall back to one rank
        return os.environ.get("LOCAL_RANK", "0") == "0"
    return True


def another_failed() -> bool:
    """A rank sharing this launcher's directory failed: a signal now is the launcher stopping the
    rest, which the failing rank and the launcher report."""
    where = _shared()
    return bool(where) and os.path.exists(os.path.join(where, FAILED))

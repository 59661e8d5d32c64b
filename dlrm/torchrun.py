"""`python -m dlrm.torchrun ...`: torch's own launcher (`torchrun`), flag for flag, ending the way
every command of this project ends.

torch's launcher answers a terminal's Ctrl-C or a scheduler's SIGTERM by stopping its workers and
then dying of the signal itself: a warning, a traceback of its `SignalException` and exit 1,
after each rank has already said in one line what happened to it. A rank that fails (a bad flag,
exit 2) gets a 20-line `ChildFailedError` block under its own one-line error. This wrapper runs
the same `torch.distributed.run.main` and ends as the ranks do (hybrid_dlrm/common/endings.py):

- a signal: nothing more is said (each rank's line is the report; rank 0's names the checkpoint
  and the resume command, which names this launcher) and the exit code is 128 + the signal;
- a rank that failed: one line naming the ranks and their exit codes, and the first one's code
  (2 for bad input, as from `python -m dlrm.train`); of ranks that all fail on the same bad flag,
  the first says why and the rest, stopped or failing, say nothing (hybrid_dlrm/common/ranks.py);
- anything else (a rendezvous that fails, a bad launcher flag) is torch's own message.

A signal before torch's agent takes the signals over (while torch imports) ends as every command
of ours ends while starting (hybrid_dlrm/common/endings.py `while_starting`).

Plain `torchrun` works too; only its endings differ.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile

from hybrid_dlrm.common import ranks

LAUNCHER = "python -m dlrm.torchrun"
# rank 0's resume command names the launcher the ranks were started by (dlrm/train.py)
LAUNCHER_ENV = "HYBRID_DLRM_LAUNCHER"
SAID_BY_THE_RANKS = ("death signal", "closing signal", "failed (exitcode")


class _NoSignalWarnings(logging.Filter):
    """torch's agent warns "Received SIGINT death signal, shutting down workers", "Sending
    process N closing signal SIGINT" and "failed (exitcode: 2) local_rank: 0 ..." for each rank:
    the ranks say it themselves, one line each."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(words in str(record.msg) for words in SAID_BY_THE_RANKS)


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torch_launcher

    os.environ[LAUNCHER_ENV] = LAUNCHER  # the workers inherit the launcher's environment
    # where the ranks agree which of them says a start-up error (hybrid_dlrm/common/ranks.py)
    shared = tempfile.mkdtemp(prefix="hybrid-dlrm-ranks-")
    os.environ[ranks.LAUNCH_DIR_ENV] = shared
    for name in ("torch.distributed.elastic.agent.server.api",
                 "torch.distributed.elastic.multiprocessing.api"):  # fmt: skip
        logging.getLogger(name).addFilter(_NoSignalWarnings())
    try:
        torch_launcher(sys.argv[1:] if argv is None else argv)
    except SignalException as e:
        return 128 + int(e.sigval)
    except ChildFailedError as e:
        return _failed(e)
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    return 0


def _failed(e) -> int:
    """One line for the ranks that failed, and the first one's exit code. A rank that ended on a
    signal (130, 143) was stopped, by the terminal or by the launcher once another had failed:
    it said so itself, and is not one of the failures."""
    codes = {
        rank: f.exitcode if f.exitcode >= 0 else 128 - f.exitcode for rank, f in e.failures.items()
    }
    failed = {rank: code for rank, code in codes.items() if code not in (130, 143)}
    if not failed:  # every rank was stopped by a signal
        return codes[min(codes)]
    by_code: dict[int, list[str]] = {}
    for rank, code in sorted(failed.items()):
        by_code.setdefault(code, []).append(str(rank))
    said = "; ".join(
        f"rank{'s' if len(ranks) > 1 else ''} {', '.join(ranks)} exited with {code}"
        for code, ranks in by_code.items()
    )
    sys.stderr.write(f"{LAUNCHER}: {said} (the reason is above)\n")
    return failed[min(failed)] or 1


if __name__ == "__main__":
    sys.exit(main())

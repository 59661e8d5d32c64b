"""One style for every line a command of this project says on stderr, whoever says it:

    python -m dlrm.train: error: --num-batches: expected a positive number, got -1
    python -m dlrm.train: warning: --compile: off with --perf-log (...)
    preprocessing kaggle: day_0 done (...)

An error names the command and ends it (exit 2, the output rule's and the flags' own lines); a
warning names the command and the run goes on; what a command is doing (progress, `-v`'s detail)
is a plain line. Python's logging would print `WARNING dlrm.checkpoints.format: ...`, a module
path the user never typed: `log_to_stderr` gives the library's log records the commands' style.
"""

from __future__ import annotations

import logging
import sys


class _CommandStyle(logging.Formatter):
    def __init__(self, prog: str) -> None:
        super().__init__()
        self.prog = prog

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)  # the message, with a traceback where one was logged
        if record.levelno >= logging.WARNING:
            return f"{self.prog}: {record.levelname.lower()}: {text}"
        return text


def log_to_stderr(prog: str, verbose: bool = False) -> None:
    """The command `prog`'s log records on stderr in its style: warnings and errors always,
    what it is doing (INFO) with `verbose`. Like `logging.basicConfig`, nothing changes where the
    process has set up logging already (a caller of `main()`, pytest)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_CommandStyle(prog))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler])

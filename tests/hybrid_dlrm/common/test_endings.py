"""One way to end (hybrid_dlrm/common/endings.py): Ctrl-C and SIGTERM, raised anywhere in a
command, are one line on stderr and the shell's exit code for the signal, and the process's own
handlers are as they were afterwards (a library caller, pytest here, keeps its Ctrl-C)."""

from __future__ import annotations

import os
import signal

import pytest

from hybrid_dlrm.common import endings


def interrupted():
    raise KeyboardInterrupt


@pytest.mark.parametrize(
    "body,code,line",
    [
        (interrupted, 130, "interrupted; nothing written"),
        (
            lambda: os.kill(os.getpid(), signal.SIGTERM),
            143,
            "terminated (SIGTERM); nothing written",
        ),
    ],
    ids=["Ctrl-C", "SIGTERM"],
)
def test_one_line_and_the_signals_exit_code(capsys, body, code, line):
    sigint, sigterm = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert endings.run(body, left=lambda: "nothing written") == code
    assert capsys.readouterr().err == f"\n{line}\n"
    assert signal.getsignal(signal.SIGINT) is sigint
    assert signal.getsignal(signal.SIGTERM) is sigterm


def test_a_finished_body_returns_its_own_code(capsys):
    assert endings.run(lambda: 2, left=lambda: "unused") == 2
    assert capsys.readouterr().err == ""

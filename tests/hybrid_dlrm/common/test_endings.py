"""One way to end (hybrid_dlrm/common/endings.py): Ctrl-C and SIGTERM, raised anywhere in a
command, are one line on stderr and the shell's exit code for the signal, and the process's own
handlers are as they were afterwards (a library caller, pytest here, keeps its Ctrl-C)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybrid_dlrm.common import endings, ranks


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


def test_a_signal_that_surfaces_as_another_error_is_still_the_signal(capsys):
    """A library interrupted inside an import fails on its half-made state (matplotlib: a
    ValueError) after swallowing the KeyboardInterrupt: the command was still interrupted."""

    def body():
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        except KeyboardInterrupt:
            raise ValueError("too many values to unpack") from None
        return 0

    assert endings.run(body, left=lambda: "nothing written") == 130
    assert capsys.readouterr().err == "\ninterrupted; nothing written\n"


def test_another_error_without_a_signal_is_not_hidden():
    def body():
        raise ValueError("a real bug")

    with pytest.raises(ValueError, match="a real bug"):
        endings.run(body)


def _as_in_a_terminal() -> None:
    """The child's SIGINT and SIGTERM as a terminal's command gets them: a suite started in the
    background by a shell without job control inherits SIGINT ignored, and Python then keeps
    ignoring it (no KeyboardInterrupt to see)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _python(code: str) -> subprocess.CompletedProcess:
    root = Path(__file__).resolve().parents[3]
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(root)), timeout=60,
                          preexec_fn=_as_in_a_terminal)  # fmt: skip


@pytest.mark.parametrize(
    "module, sig, code, line",
    [
        ("dlrm.train", signal.SIGINT, 130, "interrupted while starting; nothing written"),
        ("perfmodel", signal.SIGTERM, 143, "terminated (SIGTERM) while starting; nothing written"),
        ("their_tool", signal.SIGINT, None, None),  # a program of the user's: Python's own
    ],
)
def test_a_signal_while_a_command_of_ours_starts_is_one_line(module, sig, code, line):
    """`python -m dlrm.train` imports torch for seconds before main() takes the signals: the
    package faces call `while_starting` while `python -m` locates the command (argv[0] '-m')."""
    done = _python(
        "import os, signal, sys, time\n"
        f"sys.argv[0] = '-m'; sys.orig_argv = [sys.executable, '-m', {module!r}]\n"
        "from hybrid_dlrm.common import endings\n"
        "endings.while_starting()\n"
        f"os.kill(os.getpid(), {int(sig)}); time.sleep(5)\n"
    )
    if code is None:
        assert done.returncode == -signal.SIGINT, done.stderr  # Python dies of the signal
        assert "KeyboardInterrupt" in done.stderr
    else:
        assert (done.returncode, done.stderr) == (code, f"\n{line}\n")


def test_a_rank_the_launcher_stops_while_starting_after_another_failed_says_nothing(tmp_path):
    """Every rank fails on the same bad flag; the launcher stops those still importing torch once
    the first has failed: only that first one speaks (hybrid_dlrm/common/ranks.py)."""
    script = (
        "import os, signal, sys, time\n"
        "sys.argv[0] = '-m'; sys.orig_argv = [sys.executable, '-m', 'dlrm.train']\n"
        "from hybrid_dlrm.common import endings, ranks\n"
        f"os.environ[ranks.LAUNCH_DIR_ENV] = {str(tmp_path)!r}; os.environ['LOCAL_RANK'] = '1'\n"
        "endings.while_starting()\n"
        "print(ranks.first_to_fail(), ranks.first_to_fail(), flush=True)\n"
        "os.kill(os.getpid(), signal.SIGTERM); time.sleep(5)\n"
    )
    done = _python(script)
    assert (done.returncode, done.stdout, done.stderr) == (143, "True False\n", "")
    (tmp_path / ranks.FAILED).unlink()  # no rank failed: the signal came from someone
    done = _python(
        script.replace("print(ranks.first_to_fail(), ranks.first_to_fail(), flush=True)\n", "")
    )
    assert (done.returncode, done.stderr) == (
        143,
        "\nterminated (SIGTERM) while starting; nothing written\n",
    )


def test_an_interrupt_handled_is_not_reported_again_by_python_at_exit():
    """CPython 3.11 remembers a KeyboardInterrupt that left code a C extension ran (torch's
    import) and at exit killed the process with SIGINT (exit -2) after our line and 130."""
    done = _python(
        "import ctypes, sys\n"
        "from hybrid_dlrm.common import endings\n"
        "ctypes.c_int.in_dll(ctypes.pythonapi, '_Py_UnhandledKeyboardInterrupt').value = 1\n"
        "def body(): raise KeyboardInterrupt\n"
        "sys.exit(endings.run(body))\n"
    )
    assert (done.returncode, done.stderr) == (130, "\ninterrupted\n")


def test_the_launchers_directory_counts_only_for_the_ranks_it_started(tmp_path, monkeypatch):
    """A command run outside a launcher, the variable left in its environment, speaks for
    itself; a rank (LOCAL_RANK set) defers to the first that failed."""
    (tmp_path / ranks.FAILED).touch()
    monkeypatch.setenv(ranks.LAUNCH_DIR_ENV, str(tmp_path))
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert ranks.first_to_fail() and not ranks.another_failed()
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert not ranks.first_to_fail() and ranks.another_failed()


def test_leave_runs_the_exit_handlers_flushes_and_keeps_the_code():
    """A rank's way out after its run (the interpreter's teardown skipped): what atexit and a
    finalizer would do is done, buffered output is not lost, the code is the run's."""
    done = _python(
        "import atexit, sys, tempfile, weakref\n"
        "from hybrid_dlrm.common import endings\n"
        "atexit.register(lambda: print('atexit ran', flush=True))\n"
        "class Held: pass\n"
        "held = Held(); weakref.finalize(held, print, 'finalizer ran')\n"
        "sys.stdout.write('buffered, not flushed')\n"
        "endings.leave(3)\n"
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout.startswith("buffered, not flushed")
    assert "atexit ran" in done.stdout and "finalizer ran" in done.stdout

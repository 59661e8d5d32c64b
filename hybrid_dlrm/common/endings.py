"""One way for a command to end when it is told to: Ctrl-C (SIGINT) or SIGTERM, anywhere.

    def main(argv=None) -> int:
        return endings.run(lambda: _main(argv), left=lambda: "nothing written")

prints ONE line on stderr, `interrupted; nothing written` or `terminated (SIGTERM); ...`, and
returns 130 or 143: what a shell reports for a process killed by the signal (128 + its number),
which is what a batch scheduler, a supervisor or torchrun's agent expects back. Never a
traceback: SIGTERM is raised as `Terminated`, a KeyboardInterrupt, so the same `finally` blocks
and cleanups run for both (temporaries removed, locks released), and the line says what was left.

Worker processes leave the decision to their parent: a terminal's Ctrl-C reaches the whole
process group, and a worker that died of it would print its own traceback and lose the block it
held; `ignore_interrupts()` in the worker makes the parent's line the only one.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

from hybrid_dlrm.common import ranks

EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 143  # 128 + SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread and ended as Ctrl-C ends a command."""


_received: list[int] = []  # the signals that ended this process's command, in order


def _raise(signum, frame) -> None:
    _received.append(signum)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


# the packages whose `python -m` commands end this way (the faces that call `while_starting`)
OUR_PACKAGES = ("dlrm", "data_pipeline", "perfmodel", "embeddings", "hybrid_dlrm")
_phase = ["starting"]  # "starting" until a command's main() takes the signals, then "ending"


def while_starting() -> None:
    """Between the interpreter's start and a command's main() (importing torch takes seconds),
    Ctrl-C or SIGTERM ends `python -m <a command of ours>` with one line and 130 or 143, where
    Python would print a KeyboardInterrupt traceback from inside an import. Nothing has been
    written then, so nothing is cleaned up. Called by every package face while `python -m` locates
    the command (argv[0] is '-m' then); a program of the user's own that imports ours keeps its
    handlers: only an interpreter started to run one of our modules is changed."""
    argv = getattr(sys, "orig_argv", [])
    module = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else ""
    if sys.argv[:1] != ["-m"] or module.split(".")[0] not in OUR_PACKAGES:
        return
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _end_at_once)
        signal.signal(signal.SIGTERM, _end_at_once)


def _end_at_once(signum, frame) -> None:
    """Before main() (nothing written yet) or after it (its own line said): the line, the code."""
    how = "terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted"
    if _phase[0] == "starting" and ranks.another_failed():
        os._exit(128 + signum)  # the launcher stops the rest: the failing rank said why
    say(f"{how} while starting; nothing written" if _phase[0] == "starting" else how)
    os._exit(128 + signum)


def end_on_signals():
    """From now on SIGINT raises KeyboardInterrupt and SIGTERM Terminated in the main thread, and
    both are remembered (`interruption`); returns the handlers they replaced (None off the main
    thread, where Python lets no handler be set)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    _received.clear()
    _phase[0] = "ending"
    return signal.signal(signal.SIGINT, _raise), signal.signal(signal.SIGTERM, _raise)


def restore(previous) -> None:
    if previous is not None:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])


def interruption() -> KeyboardInterrupt | None:
    """The signal this command was told to stop by, where another error came first: a rank
    whose peer left on the same Ctrl-C sees its collective fail before its own signal is
    raised, and must say it was interrupted, not that it lost contact."""
    if not _received:
        return None
    return Terminated() if _received[0] == signal.SIGTERM else KeyboardInterrupt()


def how(e: KeyboardInterrupt) -> str:
    """The first words of the line: what ended the command."""
    return "terminated (SIGTERM)" if isinstance(e, Terminated) else "interrupted"


def exit_code(e: KeyboardInterrupt) -> int:
    return EXIT_TERMINATED if isinstance(e, Terminated) else EXIT_INTERRUPTED


def say(line: str) -> None:
    """The one line, on a line of its own (a terminal has echoed `^C` where the cursor was)."""
    sys.stderr.write(f"\n{line}\n")
    sys.stderr.flush()


def run(body: Callable[[], int], left: Callable[[], str] | None = None) -> int:
    """`body()`'s exit code; on Ctrl-C or SIGTERM one line (`left()`: what the command leaves
    behind, and how to go on) and 130 or 143. A second Ctrl-C while the line is made is ignored
    (the cleanups of `finally` blocks have run by then)."""
    return guarded(body, lambda what: what + (f"; {left()}" if left is not None else ""))


def guarded(body: Callable[[], int], line: Callable[[str], str]) -> int:
    """`body()`'s exit code, or on a signal `line(how)` said and 130 or 143. A signal that
    surfaces as another error is still the signal: a library interrupted inside an import can
    fail on its half-made state (matplotlib's colour tables: a ValueError) after the
    KeyboardInterrupt it swallowed."""
    previous = end_on_signals()
    try:
        return body()
    except KeyboardInterrupt as e:
        return ended(e, line)
    except Exception:
        stopped = interruption()
        if stopped is None:
            raise
        return ended(stopped, line)
    finally:
        restore(previous)


def ended(e: KeyboardInterrupt, line: Callable[[str], str]) -> int:
    """Say `line(how(e))` (nothing when it is empty) with Ctrl-C ignored while it is made; the
    exit code of what ended the command."""
    interrupts = ignore_interrupts()
    try:
        text = line(how(e))
        if text:
            say(text)
    finally:
        if interrupts is not None:
            signal.signal(signal.SIGINT, interrupts)
    _forget_unhandled_interrupt()
    return exit_code(e)


def _forget_unhandled_interrupt() -> None:
    """CPython 3.11 remembers a KeyboardInterrupt that left code a C extension ran (torch's
    import does) in a global, and at exit kills itself with SIGINT (exit -2, not ours) even
    though the interrupt was caught further up. It was handled: forget it. (3.12 keeps the flag
    out of reach, in _PyRuntime; there this does nothing.)"""
    import ctypes

    try:
        ctypes.c_int.in_dll(ctypes.pythonapi, "_Py_UnhandledKeyboardInterrupt").value = 0
    except (ValueError, AttributeError):  # no such symbol in this interpreter
        pass


def ignore_interrupts():
    """Ctrl-C is the parent's to act on (worker processes; the line being written); returns the
    handler it replaced (None off the main thread). SIGTERM keeps its default: a worker told to
    stop by name ends at once, silently."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGINT, signal.SIG_IGN)


def leave(code: int) -> NoReturn:
    """End this process with `code` now, as `sys.exit` would but without the interpreter's own
    teardown: Python's exit handlers run (atexit, weakref finalizers, logging) and the streams are
    flushed first. For a rank of a distributed run whose run has ended: torch's process group
    object lives on in what holds it (torchrec's sharded modules, DDP) past
    `destroy_process_group`, and destroyed in the interpreter's teardown, gloo's worker threads
    can end the process with SIGABRT ("terminate called without an active exception") after a
    run that finished and wrote everything (once in many 2-process runs, in CI too)."""
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a pipe whose reader left
            pass
    os._exit(code)

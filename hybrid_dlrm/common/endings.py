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

import signal
import sys
import threading
from collections.abc import Callable

EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 143  # 128 + SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread and ended as Ctrl-C ends a command."""


_received: list[int] = []  # the signals that ended this process's command, in order


def _raise(signum, frame) -> None:
    _received.append(signum)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def end_on_signals():
    """From now on SIGINT raises KeyboardInterrupt and SIGTERM Terminated in the main thread, and
    both are remembered (`interruption`); returns the handlers they replaced (None off the main
    thread, where Python lets no handler be set)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    _received.clear()
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
    previous = end_on_signals()
    try:
        return body()
    except KeyboardInterrupt as e:
        return ended(e, lambda what: what + (f"; {left()}" if left is not None else ""))
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
    return exit_code(e)


def ignore_interrupts():
    """Ctrl-C is the parent's to act on (worker processes; the line being written); returns the
    handler it replaced (None off the main thread). SIGTERM keeps its default: a worker told to
    stop by name ends at once, silently."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGINT, signal.SIG_IGN)

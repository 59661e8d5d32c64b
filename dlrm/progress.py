"""What a run says while it trains: the tqdm bar on a terminal, and without one (`make run > log`,
a batch job) a line every `--print-freq` steps, so a log never sits silent between the header and
the summary.

    step 512/2048 (25%)  epoch 1/1  loss 0.51234  18,342 samples/s  ETA 1m32s

The rate and the ETA are of the steps since the previous line (what the run does now, not an
average that still carries the compile and the first steps).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from tqdm import tqdm


def wanted_lines(setting: bool | None, stream: TextIO | None = None) -> bool:
    """Progress lines: `--progress false` says none; otherwise when stdout is no terminal."""
    if setting is False:
        return False
    stream = sys.stdout if stream is None else stream
    try:
        return not stream.isatty()
    except (AttributeError, ValueError):  # a closed or odd stream: say nothing
        return False


def duration(seconds: float) -> str:
    """`1h02m`, `3m05s`, `42s`."""
    s = max(0, round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


class Progress:
    """The bar (when `bar`) and the lines (when `lines` is a stream) of one training loop."""

    def __init__(
        self, total: int, initial: int, epochs: int, *, bar: bool, lines: TextIO | None
    ) -> None:
        self.total, self.epochs, self.out = total, epochs, lines
        self.bar = tqdm(total=total, initial=initial, disable=not bar, desc="train", unit="batch")
        self._since = (initial, time.perf_counter())

    def step(self) -> None:
        self.bar.update(1)

    def report(
        self, step: int, epoch: int, loss: float, since_samples: int, since_time_s: float
    ) -> None:
        """At a print step: `loss` the mean since the last report, `since_*` the samples and
        training seconds since then (evaluation and checkpoints are not training time)."""
        self.bar.set_postfix(loss=f"{loss:.4f}")
        if self.out is None:
            return
        rate = since_samples / since_time_s if since_time_s > 0 else 0.0
        last_step, _ = self._since
        steps_per_s = (step - last_step) / since_time_s if since_time_s > 0 else 0.0
        eta = (self.total - step) / steps_per_s if steps_per_s > 0 else None
        pct = 100.0 * step / self.total if self.total else 100.0
        self.out.write(
            f"step {step}/{self.total} ({pct:.0f}%)  epoch {epoch + 1}/{self.epochs}  "
            f"loss {loss:.5f}  {rate:,.0f} samples/s  "
            f"ETA {duration(eta) if eta is not None else '?'}\n"
        )
        self.out.flush()
        self._since = (step, time.perf_counter())

    def close(self) -> None:
        self.bar.close()


class Ticker:
    """A line every `every_s` seconds while a long part of the run goes on (an evaluation over a
    large test set, say): `evaluating: 3/8 batches (38%), ETA 1m20s`. A part done within
    `every_s` says nothing, so short runs read as before."""

    def __init__(
        self, what: str, total: int, say: Callable[[str], None] | None, every_s: float = 10.0
    ) -> None:
        self.what, self.total, self.say, self.every_s = what, total, say, every_s
        self.t0 = self._last = time.perf_counter()

    def tick(self, done: int) -> None:
        """`done` of the `total` batches are done."""
        now = time.perf_counter()
        if self.say is None or now - self._last < self.every_s:
            return
        self._last = now
        rate = done / (now - self.t0)
        eta = f", ETA {duration((self.total - done) / rate)}" if rate > 0 and self.total else ""
        pct = f" ({100.0 * done / self.total:.0f}%)" if self.total else ""
        self.say(f"{self.what}: {done}/{self.total} batches{pct}{eta}")

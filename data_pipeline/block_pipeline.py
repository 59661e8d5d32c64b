"""Moving one part's blocks through the parse workers and back, in order, and accounting for
the lines they reject (or stopping at the first one with `FILE:LINE: what was expected`)."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

from tqdm import tqdm

from .criteo_format import BAD_REASONS
from .errors import DataError
from .preprocess_worker import TaskResult, TaskSpec, run_task
from .raw_files import RawPart, iter_blocks
from .worker_pool import WorkerPool

logger = logging.getLogger(__name__)

MAX_EXAMPLES = 20  # bad lines quoted per part


class BlockPipeline:
    """Blocks out to workers (or inline), results back in order."""

    def __init__(self, workers: int):
        self.workers = workers
        self.executor: WorkerPool | None = WorkerPool(workers) if workers > 0 else None

    def run(
        self,
        part: RawPart,
        spec: TaskSpec,
        block_bytes: int,
        on_result: Callable[[TaskResult], None],
        bar: tqdm,
    ) -> None:
        pending: deque[tuple[Future | TaskResult, int]] = deque()
        in_flight = 2 * self.workers + 1
        done_bytes = 0

        def finish_one() -> None:
            nonlocal done_bytes
            item, consumed = pending.popleft()
            on_result(item.result() if isinstance(item, Future) else item)
            bar.update(consumed - done_bytes)
            done_bytes = consumed

        try:
            for block in iter_blocks(part, block_bytes):
                if self.executor is None:
                    pending.append((run_task(spec, block.lines(), block.offset), block.consumed))
                else:
                    pending.append((self.executor.submit(spec, block), block.consumed))
                while len(pending) > (in_flight if self.executor else 0):
                    finish_one()
            while pending:
                finish_one()
        finally:
            for item, _ in pending:
                if isinstance(item, Future):
                    item.cancel()

    def close(self) -> None:
        if self.executor is not None:
            self.executor.close()
            self.executor = None


class BadLineLog:
    """Counts rejected lines of one part, or raises on the first one."""

    def __init__(self, part: RawPart, on_bad_line: str, log: bool = True):
        self.part = part
        self.on_bad_line = on_bad_line
        self.log = log
        self.lines_before = 0
        self.counts = dict.fromkeys(BAD_REASONS, 0)
        self.examples: list[dict] = []

    def take(self, result: TaskResult) -> None:
        for index, reason, message in result.bad:
            line = self.part.first_line + self.lines_before + index
            if self.on_bad_line == "error":
                raise DataError(f"{self.part.path}:{line}: {message}")
            self.counts[reason] += 1
            if len(self.examples) < MAX_EXAMPLES:
                self.examples.append({"line": line, "reason": reason, "message": message})
                if self.log:
                    logger.warning("%s:%d: skipped: %s", self.part.path, line, message)
        self.lines_before += result.num_lines

    def check_total(self) -> None:
        n = self.part.num_lines
        if n is not None and self.lines_before != n:  # a cut in the wrong place: a bug
            raise AssertionError(f"{self.part.name}: read {self.lines_before} lines, expected {n}")
        skipped = sum(self.counts.values())
        if self.lines_before and skipped == self.lines_before:  # e.g. CRLF, or gzip named .txt
            first = self.examples[0]
            raise DataError(
                f"{self.part.path}: {self.part.name}: none of its {skipped} lines is usable (all "
                f"skipped as malformed; the first, line {first['line']}: {first['message']})"
            )

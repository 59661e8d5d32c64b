"""Worker processes for preprocessing: `python -m data_pipeline.preprocess_worker` children fed
through pipes.

Why not multiprocessing: its spawn/forkserver children re-import the caller's `__main__` (for
the trainer that is torch and more: seconds per worker), fork is unsafe in a process with
threads, and its messages are pickles. Here a child imports only numpy and this package, and a
message is one JSON line followed by raw bytes (worker_messages.py).

Each child is driven by one thread of a ThreadPoolExecutor (request, then response), so a
child's output pipe is always being read while its input is written: no pipe deadlock.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from .raw_files import Block
from .worker_messages import TaskResult, TaskSpec, read_result, write_task


class _Child:
    def __init__(self) -> None:
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[1])  # so the child imports this package
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        # a process group of its own: a terminal's Ctrl-C (sent to the foreground group) is the
        # parent's to act on, even while the child still imports; the parent closing its stdin
        # (or dying) ends it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "data_pipeline.preprocess_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            process_group=0,
        )

    def run(self, spec: TaskSpec, block: Block) -> TaskResult:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            write_task(self.proc.stdin, spec, block)
            return read_result(self.proc.stdout)
        except (BrokenPipeError, EOFError):
            code = self.proc.poll()
            raise RuntimeError(f"preprocessing worker died (exit code {code})") from None

    def close(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class WorkerPool:
    """`submit(spec, data, offset) -> Future[TaskResult]` over n child processes."""

    def __init__(self, workers: int):
        self._children = [_Child() for _ in range(workers)]
        self._idle: queue.Queue[_Child] = queue.Queue()
        for child in self._children:
            self._idle.put(child)
        self._threads = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="preprocess")

    def _run(self, spec: TaskSpec, block: Block) -> TaskResult:
        child = self._idle.get()
        try:
            return child.run(spec, block)
        finally:
            self._idle.put(child)

    def submit(self, spec: TaskSpec, block: Block) -> Future:
        return self._threads.submit(self._run, spec, block)

    def close(self) -> None:
        self._threads.shutdown(wait=True, cancel_futures=True)
        for child in self._children:
            child.close()

"""Worker processes for preprocessing: `python -m data_pipeline.preprocess_worker` children fed
through pipes.

Why not multiprocessing: its spawn/forkserver children re-import the caller's `__main__` (for
the trainer that is torch and more: seconds per worker), fork is unsafe in a process with
threads, and its messages are pickles. Here a child imports only numpy and this package, and a
message is one JSON line followed by raw bytes:

    task:   {"spec": {...TaskSpec}, "offset": int, "nbytes": int} \\n <nbytes of raw lines>
            or {"spec": ..., "offset": int, "path": str, "end": int} \\n (the child reads them)
    result: {"num_lines", "rows", "bad", "arrays": [[name, dtype, shape], ...]} \\n <array bytes>
            or {"error": "traceback"} \\n, or {"data_error": "one line"} \\n

Each child is driven by one thread of a ThreadPoolExecutor (request, then response), so a
child's output pipe is always being read while its input is written: no pipe deadlock.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

import numpy as np

from .errors import DataError
from .preprocess_worker import TaskResult, TaskSpec
from .raw_files import Block, read_range

_ARRAY_FIELDS = ("labels", "dense", "sparse")


def _read_exactly(stream: BinaryIO, n: int) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise EOFError(f"worker pipe closed after {len(data)} of {n} bytes")
    return data


def write_task(stream: BinaryIO, spec: TaskSpec, block: Block) -> None:
    header: dict = {"spec": dataclasses.asdict(spec), "offset": block.offset}
    if block.data is None:
        header.update(path=str(Path(block.path).absolute()), end=block.end)
        stream.write(json.dumps(header).encode() + b"\n")
    else:
        header["nbytes"] = len(block.data)
        stream.write(json.dumps(header).encode() + b"\n")
        stream.write(block.data)
    stream.flush()


def read_task(stream: BinaryIO) -> tuple[TaskSpec, bytearray | bytes, int] | None:
    line = stream.readline()
    if not line:
        return None
    header = json.loads(line)
    offset = header["offset"]
    if "path" in header:
        data: bytearray | bytes = read_range(header["path"], offset, header["end"])
    else:
        data = _read_exactly(stream, header["nbytes"])
    return TaskSpec(**header["spec"]), data, offset


def write_result(stream: BinaryIO, result: TaskResult) -> None:
    arrays: list[tuple[str, np.ndarray]] = [
        (name, getattr(result, name)) for name in _ARRAY_FIELDS if getattr(result, name) is not None
    ]
    for f, (values, counts) in enumerate(result.counts):
        arrays += [(f"values_{f}", values), (f"counts_{f}", counts)]
    arrays = [(name, np.ascontiguousarray(a)) for name, a in arrays]
    header = {
        "num_lines": result.num_lines,
        "rows": result.rows,
        "bad": result.bad,
        "arrays": [[name, a.dtype.str, list(a.shape)] for name, a in arrays],
    }
    stream.write(json.dumps(header).encode() + b"\n")
    for _, a in arrays:
        if a.size:  # a block whose every line was bad: no bytes (and a zero-size view has no cast)
            stream.write(memoryview(a).cast("B"))
    stream.flush()


def write_error(stream: BinaryIO, text: str, data_error: bool = False) -> None:
    stream.write(json.dumps({"data_error" if data_error else "error": text}).encode() + b"\n")
    stream.flush()


def read_result(stream: BinaryIO) -> TaskResult:
    line = stream.readline()
    if not line:
        raise EOFError("worker exited")
    header = json.loads(line)
    if "data_error" in header:
        raise DataError(header["data_error"])
    if "error" in header:
        raise RuntimeError(f"preprocessing worker failed:\n{header['error']}")
    result = TaskResult(
        num_lines=header["num_lines"], bad=[tuple(b) for b in header["bad"]], rows=header["rows"]
    )
    named = {}
    for name, dtype, shape in header["arrays"]:
        dt = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        named[name] = np.frombuffer(_read_exactly(stream, n), dtype=dt).reshape(shape)
    for name in _ARRAY_FIELDS:
        setattr(result, name, named.get(name))
    f = 0
    while f"values_{f}" in named:
        result.counts.append((named[f"values_{f}"], named[f"counts_{f}"]))
        f += 1
    return result


class _Child:
    def __init__(self) -> None:
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[1])  # so the child imports this package
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "data_pipeline.preprocess_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
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

"""What the preprocessing parent and its worker processes (worker_pool.py,
preprocess_worker.py) say to each other: a task is a `TaskSpec` and a block of whole lines, a
result a `TaskResult`. A message is one JSON line followed by raw bytes:

    task:   {"spec": {...TaskSpec}, "offset": int, "nbytes": int} \\n <nbytes of raw lines>
            or {"spec": ..., "offset": int, "path": str, "end": int} \\n (the child reads them)
    result: {"num_lines", "rows", "bad", "arrays": [[name, dtype, shape], ...]} \\n <array bytes>
            or {"error": "traceback"} \\n, or {"data_error": "one line"} \\n
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from .errors import DataError
from .raw_files import Block, read_range


@dataclass(frozen=True)
class TaskSpec:
    kind: str  # "encode" or "count"
    has_label: bool
    sub_sample_rate: float  # 0.0 except on training days
    sub_sample_key: int  # seeds the per-line down-sampling draw (see keep_mask)
    max_ind_range: int  # > 0: hash mode
    vocab_dir: str | None  # frequency mode: the Vocabulary directory
    index_dtype: str  # "int32" or "int64"


@dataclass
class TaskResult:
    num_lines: int
    bad: list[tuple[int, str, str]]  # (0-based line in the block, reason, message)
    rows: int = 0
    labels: np.ndarray | None = None
    dense: np.ndarray | None = None
    sparse: np.ndarray | None = None
    counts: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)


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

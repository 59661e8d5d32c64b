"""The per-block work of preprocessing, run in worker processes (or inline).

Run as `python -m data_pipeline.preprocess_worker`, it serves tasks on stdin/stdout (see
worker_messages for the message format) until stdin closes.

A task is a block of whole lines plus a small `TaskSpec`; the result is either the block's
encoded columns (labels, dense, sparse ids) or its per-feature value counts, plus the lines it
rejected. Results go back in order to the main process, which alone writes files, so the output
does not depend on how many workers there are.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import traceback

import numpy as np

from hybrid_dlrm.common import endings

from . import categorical
from .criteo_format import NUM_SPARSE, dense_transform, parse_block
from .errors import DataError
from .worker_messages import TaskResult, TaskSpec, read_task, write_error, write_result

logger = logging.getLogger(__name__)

_M64 = (1 << 64) - 1


def _mix64(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def sub_sample_key(seed: int, part_name: str) -> int:
    """A 64-bit key per (seed, part) for the down-sampling draws; stable across runs."""
    h = seed & _M64
    for byte in part_name.encode():
        h = ((h ^ byte) * 0x100000001B3) & _M64  # FNV-1a style
    return h


def keep_mask(labels: np.ndarray, line_offsets: np.ndarray, rate: float, key: int) -> np.ndarray:
    """Negative down-sampling: drop a label-0 row when its uniform draw is below `rate`.

    The draw is a hash of (key, byte offset of the line in its file), so it is the same however
    the file is cut into blocks and whichever worker sees the line: reruns are identical.
    """
    u = _mix64(line_offsets.astype(np.uint64) ^ np.uint64(key)) >> np.uint64(11)
    draw = u.astype(np.float64) * (1.0 / (1 << 53))
    return (labels != 0) | (draw >= rate)


_vocab_cache: dict[str, categorical.Vocabulary] = {}


def run_task(spec: TaskSpec, data: bytes | bytearray, offset: int) -> TaskResult:
    parsed = parse_block(data, has_label=spec.has_label)
    result = TaskResult(
        num_lines=parsed.num_lines, bad=[(b.index, b.reason, b.message) for b in parsed.bad]
    )
    labels, ints, cats = parsed.labels, parsed.ints, parsed.cats
    if spec.sub_sample_rate > 0.0 and labels is not None:
        keep = keep_mask(labels, parsed.offsets + offset, spec.sub_sample_rate, spec.sub_sample_key)
        labels, ints, cats = labels[keep], ints[keep], cats[keep]
    result.rows = len(ints)
    if spec.max_ind_range > 0 and (spec.kind == "count" or spec.vocab_dir):  # contiguous hash
        cats = categorical.hash_ids(cats, spec.max_ind_range, np.dtype(np.int64))
    if spec.kind == "count":
        for f in range(NUM_SPARSE):
            result.counts.append(np.unique(cats[:, f], return_counts=True))
        return result
    dtype = np.dtype(spec.index_dtype)
    if spec.max_ind_range > 0 and not spec.vocab_dir:
        result.sparse = categorical.hash_ids(cats, spec.max_ind_range, dtype)
    else:
        vocab = _vocab_cache.get(spec.vocab_dir)
        if vocab is None:
            vocab = _vocab_cache[spec.vocab_dir] = categorical.Vocabulary(
                spec.vocab_dir, NUM_SPARSE
            )
        result.sparse = vocab.ids(cats, dtype, renumbered=spec.max_ind_range > 0)
    result.labels = labels
    result.dense = dense_transform(ints)
    return result


def forget_vocabularies() -> None:
    """Drop memory-mapped vocabularies (inline mode), e.g. before a directory is rebuilt."""
    _vocab_cache.clear()


def init_worker() -> None:
    """Worker-process setup: keep freed memory in the heap.

    The parser makes many short-lived arrays of a few hundred KB; glibc returns such blocks to
    the OS and faults them in again on every call, which halves the parse speed. Raising the
    mmap and trim thresholds (mallopt) keeps them in the heap. Only done in worker processes,
    never in the caller's (e.g. the trainer's) process.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):  # not glibc: slower, still correct
        logger.debug("mallopt unavailable; keeping the default allocator settings")


def main() -> None:
    init_worker()
    endings.ignore_interrupts()  # Ctrl-C reaches the process group: the parent decides and says
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        try:
            task = read_task(stdin)
            if task is None:
                return
            result = run_task(*task)
        except DataError as e:  # e.g. the raw file changed under us: the user's to fix
            write_error(stdout, str(e), data_error=True)
            continue
        except Exception:
            write_error(stdout, traceback.format_exc())
            continue
        write_result(stdout, result)


if __name__ == "__main__":
    main()

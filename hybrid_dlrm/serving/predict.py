"""`python -m hybrid_dlrm.serving.predict`: score a preprocessed split or raw Criteo lines with an artifact.

    python -m hybrid_dlrm.serving.predict --model ARTIFACT --data RAW_FILE_OR_DATASET --out preds.csv

Raw Criteo lines (plain or .gz; 40 fields, or 39 without the label as in Kaggle's `test.txt`)
go through the preprocessing's own parser and categorical mapping (data_pipeline: parse_block,
the hash or the frequency dictionaries, run by its worker processes while this process scores),
with what the artifact carries: the hashing modulus, or the dictionaries as sorted value/id
arrays. A value never seen in training gets the out-of-vocabulary id, as in preprocessing.
Rows are scored by `Predictor.predict_rows` (ids as arrays, no KeyedJaggedTensor): this command
never imports torchrec, whose import costs seconds.

Output (CSV; hybrid_dlrm/serving/output.py: an existing `--out` needs `--overwrite`, the input and the
artifact are never written over, only regular files are, `-` is stdout with the summary on
stderr, and an earlier file of that name survives a failed run):
- raw lines without a label: the Kaggle submission layout `Id,Predicted`, Id = 60000000 + the
  line's 0-based index (Kaggle's test ids);
- raw lines with a label: `line,label,predicted` (1-based line numbers);
- a preprocessed split: `row,label,predicted` (the `inference` split, Kaggle's unlabelled
  test.txt: `Id,Predicted`).

A malformed line is `FILE:LINE: what was expected` (exit 2), or, with `--on-bad-line skip`,
skipped, counted and reported at the end.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from data_pipeline.errors import DataError
from dlrm.train import EXIT_USAGE, OneLineParser
from hybrid_dlrm.common import cli_lines
from hybrid_dlrm.serving.output import CsvOutput, check_out

PROG = "python -m hybrid_dlrm.serving.predict"
KAGGLE_FIRST_ID = 60_000_000
_DEL = 0xFF


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument(
        "--model", required=True, help="inference artifact (python -m hybrid_dlrm.serving.quantize)"
    )
    p.add_argument("--data", required=True, help="raw Criteo file, or preprocessed data set")
    p.add_argument("--out", required=True, help="CSV file to write (-: stdout)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    p.add_argument("--split", default="test", help="split of a preprocessed data set")
    p.add_argument("--on-bad-line", default="error", help="error (default) or skip")
    p.add_argument("--batch-size", type=int, default=2048)
    p.add_argument("--workers", type=int, default=None,
                   help="parse processes (default: one per core but one; 0: inline)")  # fmt: skip
    p.add_argument("--block-mb", type=float, default=2.0, help="raw bytes per parse task")
    p.add_argument("--threads", type=int, default=None,
                   help="scoring threads (default: the cores the parse workers leave, at least 1)")  # fmt: skip
    p.add_argument("--embedding-backend", default="auto", help="auto, fbgemm or torch")
    # the SSD tier (docs/scm.md): tables larger than memory, read through a DRAM row cache
    p.add_argument("--scm-dir", help="serve the tables from the SSD tier in this directory")
    p.add_argument("--scm-cache", default="256MB", help="--scm-dir: DRAM for the row cache")
    p.add_argument("--scm-io", default="direct", help="--scm-dir: direct (O_DIRECT) or buffered")
    return p


# --- CSV, vectorised ------------------------------------------------------------------------------


def _decimal(x: np.ndarray, width: int) -> np.ndarray:
    """Non-negative integers -> [n, width] ASCII digits, leading zeros replaced by _DEL."""
    digits = np.empty((len(x), width), dtype=np.uint8)
    v = x.astype(np.int64)
    for col in range(width - 1, -1, -1):
        q = v // 10
        digits[:, col] = (v - q * 10).astype(np.uint8) + ord("0")
        v = q
    ndig = np.ones(len(x), dtype=np.int64)
    for k in range(1, width):
        ndig += x >= 10**k
    digits[np.arange(width)[None, :] < (width - ndig)[:, None]] = _DEL
    return digits


def format_csv(columns: list[np.ndarray | None], probabilities: np.ndarray) -> bytes:
    """Rows of integer columns (None: an empty field) then the probability with 6 decimals."""
    n = len(probabilities)
    parts = []
    for c in columns:
        if c is None:
            parts.append(np.full((n, 0), _DEL, dtype=np.uint8))
        else:
            width = max(1, len(str(int(c.max())))) if n else 1
            parts.append(_decimal(c, width))
        parts.append(np.full((n, 1), ord(","), dtype=np.uint8))
    q = np.rint(np.clip(probabilities, 0.0, 1.0) * 1e6).astype(np.int64)
    whole = q // 1_000_000
    parts += [
        (whole.astype(np.uint8) + ord("0"))[:, None],
        np.full((n, 1), ord("."), dtype=np.uint8),
        _decimal(q - whole * 1_000_000, 6),
        np.full((n, 1), ord("\n"), dtype=np.uint8),
    ]
    m = np.concatenate(parts, axis=1)
    # the fraction's leading zeros are digits: put them back
    frac = m[:, -7:-1]
    frac[frac == _DEL] = ord("0")
    return m[m != _DEL].tobytes()


# --- scoring ----------------------------------------------------------------------------------------


def _score(predictor, dense: np.ndarray, sparse: np.ndarray, batch_size: int) -> np.ndarray:
    """Probabilities of rows given as dense [n, 13] and ids [n, 26] (feature order)."""
    out = np.empty(len(dense), dtype=np.float64)
    for lo in range(0, len(dense), batch_size):
        d = torch.from_numpy(np.array(dense[lo : lo + batch_size]))  # a worker's read-only buffer
        ids = torch.from_numpy(np.array(sparse[lo : lo + batch_size]))
        out[lo : lo + len(d)] = predictor.predict_rows(d, ids).double().numpy()
    return out


def _has_label(path: Path) -> bool:
    """40 fields: labelled; 39: not (Kaggle's test.txt); anything else: FILE:1: ..."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            first = f.readline()
    except (OSError, EOFError) as e:
        raise DataError(f"{path}: unreadable ({e})") from None
    if not first:
        raise DataError(f"{path}: empty: expected raw Criteo lines")
    fields = first.rstrip(b"\r\n").count(b"\t") + 1
    if fields not in (39, 40):
        raise DataError(
            f"{path}:1: expected 40 tab-separated fields (label, 13 integers, 26 categoricals) "
            f"or 39 (no label, as in Kaggle's test.txt), found {fields}"
        )
    return fields == 40


def predict_raw(predictor, path: Path, out: Path | None, on_bad_line: str, batch_size: int,
                workers: int, block_bytes: int) -> dict:  # fmt: skip
    from data_pipeline.block_pipeline import BadLineLog, BlockPipeline
    from data_pipeline.preprocess_worker import TaskResult, TaskSpec
    from data_pipeline.raw_files import RawPart

    mapping = predictor.manifest.get("categorical")
    if not mapping:
        raise DataError(
            f"{predictor.artifact.path}: carries no categorical mapping (the model was not trained "
            "on Criteo data): score a preprocessed data set instead"
        )
    if path.is_dir():
        raise DataError(
            f"{path}: a directory without meta.json, so not a preprocessed data set; expected "
            "raw Criteo lines (a file, plain or .gz) or a preprocessed data set's directory"
        )
    if not path.exists():
        raise DataError(f"{path}: not found (expected raw Criteo lines or a preprocessed data set)")
    labelled = _has_label(path)
    part = RawPart("predict", path, has_label=labelled)
    spec = TaskSpec(
        kind="encode", has_label=labelled, sub_sample_rate=0.0, sub_sample_key=0,
        max_ind_range=mapping.get("max_ind_range", 0) if mapping["mode"] == "hash" else 0,
        vocab_dir=(str(predictor.artifact.mapping_dir)
                   if mapping["mode"] == "frequency" or mapping.get("contiguous") else None),
        # int32 where every table fits: half the bytes through the workers' pipes and the copies
        index_dtype="int32" if max(t.num_embeddings for t in predictor.artifact.tables) < 2**31 else "int64",
    )  # fmt: skip
    writer = CsvOutput(out, "line,label,predicted" if labelled else "Id,Predicted")
    bad = BadLineLog(part, on_bad_line)
    lines_before = 0

    def take(result: TaskResult) -> None:
        nonlocal lines_before
        bad.take(result)  # raises FILE:LINE: ... in error mode
        keep = np.ones(result.num_lines, dtype=bool)
        keep[[b[0] for b in result.bad]] = False
        index = lines_before + np.flatnonzero(keep)
        lines_before += result.num_lines
        if result.rows == 0:
            return
        p = _score(predictor, result.dense, result.sparse, batch_size)
        if labelled:
            cols = [index + 1, result.labels.astype(np.int64)]
        else:
            cols = [index + KAGGLE_FIRST_ID]
        writer.write(format_csv(cols, p), len(p))

    from tqdm import tqdm

    pipeline = BlockPipeline(workers)
    try:
        with tqdm(disable=True) as bar:
            pipeline.run(part, spec, block_bytes, take, bar)
        bad.check_total()
    except BaseException:
        writer.abort()
        raise
    finally:
        pipeline.close()
    writer.finish()
    return {"lines": lines_before, "rows": writer.rows, "bad_lines": bad.counts}


def _check_tables(sizes: list[int] | None, tables, meta: Path) -> None:
    """A data set preprocessed for other tables than the model's (a synthetic run's artifact
    on Criteo columns) is one line up front, not an id error from the first batch."""
    if sizes is None:
        return
    rows = [t.num_embeddings for t in tables]
    if len(sizes) != len(rows):
        raise DataError(f"{meta}: {len(sizes)} tables, the model has {len(rows)}; score a data "
                        "set preprocessed like the model's training data")  # fmt: skip
    for t, n in zip(tables, sizes):
        if n > t.num_embeddings:
            raise DataError(f"{meta}: table {t.feature_name} has {n} rows, the model's "
                            f"{t.num_embeddings}; score a data set preprocessed like the model's "
                            "training data")  # fmt: skip


def predict_dataset(
    predictor, directory: Path, split: str, out: Path | None, batch_size: int
) -> dict:
    meta = json.loads((directory / "meta.json").read_text())
    _check_tables(meta.get("table_sizes"), predictor.artifact.tables, directory / "meta.json")
    if meta.get("dataset") == "taobao":
        from data_pipeline.taobao_dataset import TaobaoBatchSource, TaobaoDataset

        layout = predictor.kind.layout
        source = TaobaoBatchSource(TaobaoDataset(directory), split, batch_size, layout=layout)
    else:
        from data_pipeline.criteo import CriteoBatchSource

        source = CriteoBatchSource(directory, split, batch_size)
    kaggle = split == "inference"
    writer = CsvOutput(out, "Id,Predicted" if kaggle else "row,label,predicted")
    row = 0
    try:
        for batch in source.batches(0):
            p = predictor.predict(batch).double().numpy()
            index = np.arange(row, row + len(p))
            row += len(p)
            labels = batch.labels.numpy()
            if kaggle:
                cols = [index + KAGGLE_FIRST_ID]
            elif np.isnan(labels).any():
                cols = [index, None]
            else:
                cols = [index, labels.astype(np.int64)]
            writer.write(format_csv(cols, p), len(p))
    except BaseException:
        writer.abort()
        raise
    writer.finish()
    return {"rows": row}


def _tier_stats(predictor) -> dict:
    emb = predictor.model.embeddings
    info, c = emb.placement_info(), emb.counters()
    return {
        "dir": info["scm_dir"], "cache_bytes": info["scm_cache_bytes"],
        "cache_hit_rate": c["scm_cache_hit_rate"], "rows_read": c["scm_rows_read"],
        "bytes_read": c["scm_bytes_read"],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    cli_lines.log_to_stderr(PROG)  # warnings as `{prog}: warning: ...`
    a = build_parser().parse_args(argv)
    from dlrm.errors import ConfigError
    from embeddings.errors import ScmError
    from hybrid_dlrm.serving.artifact import ArtifactError

    t0 = time.perf_counter()
    try:
        if a.on_bad_line not in ("error", "skip"):
            raise ConfigError(f"--on-bad-line: expected error or skip, got {a.on_bad_line!r}")
        if (a.batch_size < 1 or (a.workers is not None and a.workers < 0) or a.block_mb <= 0
                or (a.threads is not None and a.threads < 1)):  # fmt: skip
            raise ConfigError(
                "--batch-size, --workers, --block-mb, --threads: expected positive numbers"
            )
        if a.embedding_backend not in ("auto", "fbgemm", "torch"):
            raise ConfigError(
                f"--embedding-backend: expected auto, fbgemm or torch, got {a.embedding_backend!r}"
            )
        protected = {"--data": Path(a.data), "--model": Path(a.model)}
        if a.scm_dir:
            protected["--scm-dir"] = Path(a.scm_dir)
        out = check_out(a.out, a.overwrite, protected)
        from hybrid_dlrm.serving.predictor import Predictor

        predictor = Predictor.load(
            a.model, backend=a.embedding_backend, scm_dir=a.scm_dir, scm_cache=a.scm_cache,
            scm_io=a.scm_io,
        )  # fmt: skip
        data = Path(a.data)
        if (data / "meta.json").is_file():
            if a.threads:
                torch.set_num_threads(a.threads)
            stats = predict_dataset(predictor, data, a.split, out, a.batch_size)
        else:
            cores = len(os.sched_getaffinity(0))
            workers = max(1, cores - 1) if a.workers is None else a.workers
            # more scoring threads than free cores wait on each other: on the shared 2-core
            # machine, 1M lines took 3.4-3.8x the wall time and 3.7-4.7x the CPU with two
            # threads beside the parse worker than with one (docs/inference.md)
            torch.set_num_threads(a.threads or max(1, cores - workers))
            stats = predict_raw(predictor, data, out, a.on_bad_line, a.batch_size, workers,
                                int(a.block_mb * 2**20))  # fmt: skip
        if a.scm_dir:  # say that the tables were served from the tier, and how it did
            stats["ssd_tier"] = _tier_stats(predictor)
    except (ConfigError, DataError, ArtifactError, ScmError) as e:
        sys.stderr.write(f"{PROG}: error: {e}\n")
        return EXIT_USAGE
    seconds = time.perf_counter() - t0
    stats.update(out=str(out) if out else "-", seconds=round(seconds, 3))
    skipped = sum(stats.get("bad_lines", {}).values())
    if skipped:
        sys.stderr.write(f"{PROG}: skipped {skipped} malformed lines ({stats['bad_lines']})\n")
    print(json.dumps(stats), file=sys.stdout if out else sys.stderr)
    return 0


if __name__ == "__main__":
    from hybrid_dlrm.common import endings  # Ctrl-C / SIGTERM: one line, exit 130 / 143

    sys.exit(endings.run(main, left=lambda: "no file written"))  # its writes are atomic

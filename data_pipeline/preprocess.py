"""Raw Criteo Kaggle/Terabyte files -> a preprocessed column directory (see dataset_meta).

Streaming: the main process reads whole-line blocks (8 MB by default), worker processes parse
and encode them, and the main process appends the results, in order, to the part's `.npy`
files. Memory is a few blocks in flight, whatever the input size; only the frequency-mode
counts grow, with the number of distinct values.

Resumable: each part (day) is published atomically with a marker recording its files' sizes
and CRC-32s; a rerun with the same options re-verifies and skips finished parts, and redoes the
rest from their start. `meta.json` is written last.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from hybrid_dlrm.common.lock import DirectoryLock, LockError

from . import dataset_meta as dm
from .block_pipeline import BadLineLog, BlockPipeline
from .categorical import FrequencyCounter, Vocabulary
from .criteo_format import (
    BAD_REASONS,
    DENSE_NAMES,
    FEATURE_NAMES,
    NUM_DENSE,
    NUM_SPARSE,
    SPARSE_NAMES,
)
from .errors import DataError, unwritable_dir
from .npy_stream import NpyWriter
from .preprocess_worker import TaskResult, TaskSpec, forget_vocabularies, sub_sample_key
from .raw_files import (
    RawPart,
    comparable_identity,
    identity_checks,
    kaggle_files,
    kaggle_parts,
    raw_identity,
    split_halves,
    terabyte_files,
    terabyte_parts,
)

logger = logging.getLogger(__name__)

DATASETS = ("kaggle", "terabyte")
DEFAULT_TERABYTE_MAX_IND_RANGE = 10_000_000  # the reference Terabyte benchmark's value
_INLINE_BELOW_BYTES = 32 << 20  # smaller inputs are not worth starting worker processes


@dataclass(frozen=True)
class PreprocessOptions:
    """Every knob of preprocessing. Only some change the output (see `settings`)."""

    max_ind_range: int | None = None  # > 0: hash mode; <= 0: frequency mode; None: per dataset
    frequency_threshold: int | None = None  # frequency mode: values seen < T times share an id
    # hash mode: each feature's distinct value % M renumbered 0..n-1 (the reference's and
    # MLPerf's tables of n rows), not M rows of value % M
    contiguous_ids: bool = False
    sub_sample_rate: float = 0.0  # drop label-0 training rows with this probability
    seed: int = 0  # seeds the down-sampling
    on_bad_line: str = "error"  # or "skip"
    test_raw: str | Path | None = None  # Kaggle's unlabelled test.txt -> "inference" part
    workers: int | None = None  # parse processes; 0 = inline; None = automatic
    block_bytes: int = 8 << 20
    progress: bool | None = None  # None: only when stderr is a terminal

    def categorical(self, dataset: str) -> dict:
        m, t = self.max_ind_range, self.frequency_threshold
        if m is not None and m > 0:
            if t is not None and t > 1:
                raise DataError(
                    f"--max-ind-range {m} and --frequency-threshold {t}: choose one way to map "
                    "categorical values (hashing, or ids by frequency)"
                )
            return self._hash(int(m))
        if m is None and t is None and dataset == "terabyte":
            return self._hash(DEFAULT_TERABYTE_MAX_IND_RANGE)
        if self.contiguous_ids:
            raise DataError(
                "--contiguous-ids: renumbers hash mode's ids; frequency mode's ids are already "
                "contiguous (give --max-ind-range M > 0)"
            )
        if t is not None and t < 0:
            raise DataError(f"--frequency-threshold: expected a count >= 0, got {t}")
        return {"mode": "frequency", "threshold": max(1, int(t or 1))}

    def _hash(self, m: int) -> dict:
        # an older directory has no "contiguous" key: its settings stay the same
        return {
            "mode": "hash",
            "max_ind_range": m,
            **({"contiguous": True} if self.contiguous_ids else {}),
        }

    def validate(self, dataset: str) -> None:
        if dataset not in DATASETS:
            raise DataError(f"--dataset: expected one of {', '.join(DATASETS)}, got {dataset!r}")
        if not 0.0 <= self.sub_sample_rate <= 1.0:
            raise DataError(
                f"--data-sub-sample-rate: expected a number in [0, 1], got {self.sub_sample_rate}"
            )
        if self.on_bad_line not in ("error", "skip"):
            raise DataError(f"--on-bad-line: expected error or skip, got {self.on_bad_line!r}")
        if self.test_raw is not None and dataset != "kaggle":
            raise DataError("--test-raw: only the Kaggle dataset has an unlabelled test.txt")
        if self.workers is not None and self.workers < 0:
            raise DataError(f"--workers: expected a count >= 0, got {self.workers}")
        if self.block_bytes < 1:
            raise DataError(f"--block-mb: expected a positive size, got {self.block_bytes} bytes")
        self.categorical(dataset)

    def settings(self, dataset: str) -> dict:
        """What the output depends on: the fingerprint stored with every part."""
        rate = float(self.sub_sample_rate)
        return {
            "dataset": dataset,
            "categorical": self.categorical(dataset),
            "sub_sample_rate": rate,
            "seed": int(self.seed) if rate > 0 else None,  # irrelevant without down-sampling
            "inference_part": self.test_raw is not None,
            "format_version": dm.FORMAT_VERSION,
        }


def raw_files(dataset: str, raw: Path, options: PreprocessOptions) -> list[Path | None]:
    """The raw input files (Kaggle: train.txt and test.txt or None; Terabyte: the days)."""
    if dataset == "kaggle":
        test = Path(options.test_raw) if options.test_raw is not None else None
        return list(kaggle_files(raw, test))
    return list(terabyte_files(raw))


def raw_parts(dataset: str, files: list[Path | None]) -> list[RawPart]:
    if dataset == "kaggle":
        return kaggle_parts(files[0], files[1])
    return terabyte_parts(files)


def _raw_identity(files: list[Path | None]) -> dict[str, dict]:
    """Per raw file (by name), what the result is tied to (`raw_identity`)."""
    return {f.name: raw_identity(f) for f in files if f is not None}


def _comparable(recorded: dict, now: dict) -> dict:
    """`now` in the form `recorded` has (`comparable_identity`). Logs which check is made."""
    if not isinstance(recorded, dict):  # damaged: nothing compares equal to it
        return now
    cut = {k: comparable_identity(recorded[k], v) if k in recorded else v for k, v in now.items()}
    checks = sorted({identity_checks(v) for v in recorded.values()})
    logger.info("raw files checked by %s", "; ".join(checks))
    return cut


def preprocess(
    dataset: str, raw: str | Path, out: str | Path, options: PreprocessOptions = PreprocessOptions()
) -> Path:
    """Make (or finish, or verify and reuse) the preprocessed directory `out`; returns it.

    Safe to call from several processes at once (e.g. every rank of a distributed run): one
    makes the directory while the others wait on its lock, then reuse the result."""
    raw, out = Path(raw), Path(out)
    options.validate(dataset)
    settings = options.settings(dataset)
    if (out / "meta.json").is_file():
        return _reuse(out, raw, dataset, settings, options)
    files = raw_files(dataset, raw, options)
    problem = unwritable_dir(out)
    if problem:
        raise DataError(f"{problem} (where the preprocessed data set goes)")
    out.mkdir(parents=True, exist_ok=True)
    with _locked(out):
        if (out / "meta.json").is_file():  # made by another process while we waited
            return _reuse(out, raw, dataset, settings, options)
        identity = _raw_identity(files)
        plan = {"settings": settings, "raw": identity}
        plan_path = out / "options.json"
        if plan_path.is_file():
            old = dm.read_json(plan_path)
            if old != {"settings": settings, "raw": _comparable(old.get("raw", {}), identity)}:
                raise DataError(
                    f"{out}: holds an unfinished preprocessing with different options or raw "
                    f"files ({dm.describe_difference(old, plan)}); delete it or choose another "
                    "directory"
                )
        else:
            dm.write_json(plan_path, plan)
        for leftover in out.glob("*.tmp"):  # from an interrupted run; never part of the result
            leftover.unlink()
        _warn_if_disk_is_small(out, files)
        parts = raw_parts(dataset, files)
        return _Run(dataset, out, parts, options, settings, identity).execute()


@contextlib.contextmanager
def _locked(out: Path) -> Iterator[None]:
    """An exclusive lock on out/.lock, held while making the directory: waits while another
    living process holds it, one DataError when its holder has ended or it cannot be made."""
    lock = DirectoryLock(out, reentrant=False)  # threads of one process take turns too
    try:
        lock.acquire_waiting(
            "preprocessing",
            lambda pid: logger.warning("%s: process %s is preprocessing it; waiting", out, pid),
        )
    except LockError as e:
        raise DataError(str(e)) from None
    try:
        yield
    finally:
        lock.release()


def _warn_if_disk_is_small(out: Path, files: list[Path | None]) -> None:
    raw_bytes = sum(f.stat().st_size * (4 if f.suffix == ".gz" else 1) for f in files if f)
    need = int(raw_bytes * 0.7)  # ~157 output bytes per ~240-byte line, before down-sampling
    free = shutil.disk_usage(out).free
    if need > free:
        logger.warning(
            "%s: about %.1f GB of output expected, %.1f GB free", out, need / 1e9, free / 1e9
        )


def _reuse(out: Path, raw: Path, dataset: str, settings: dict, options: PreprocessOptions) -> Path:
    meta = dm.load_meta(out)
    if meta.get("settings") != settings:
        raise DataError(
            f"{out}: was preprocessed with other options "
            f"({dm.describe_difference(meta.get('settings', {}), settings)}); "
            "delete it or choose another directory"
        )
    dm.check_bad_line_policy(str(out), sum(meta["bad_lines"].values()), options.on_bad_line)
    if raw.exists():  # the raw data may be gone after preprocessing: that is fine
        recorded, now = (
            meta["raw"],
            _comparable(meta["raw"], _raw_identity(raw_files(dataset, raw, options))),
        )
        if recorded != now:
            raise DataError(
                f"{out}: was made from other raw files "
                f"({dm.describe_difference({'raw': recorded}, {'raw': now})}); "
                "delete it or choose another directory"
            )
    # The frequency counts are scaffolding, removed right after meta.json: a kill in between
    # leaves them behind (as large as the vocabularies), and nothing reads them again.
    shutil.rmtree(out / "counts", ignore_errors=True)
    for part in meta["parts"]:
        problem = dm.part_problem(out, part["name"], meta["settings"], full=False)
        if problem:
            raise DataError(f"{out}: {part['name']}: {problem}; delete the directory and rerun")
    logger.info("reusing preprocessed %s", out)
    return out


class _Run:
    def __init__(self, dataset, out, parts, options, settings, identity):
        self.dataset = dataset
        self.out: Path = out
        self.parts: list[RawPart] = parts
        self.options: PreprocessOptions = options
        self.settings: dict = settings
        self.identity = identity
        self.categorical: dict = settings["categorical"]
        total = sum(p.size() for p in parts)
        workers = options.workers
        if workers is None:
            # one per core: the main process only reads and writes (a small share of a core)
            workers = 0 if total < _INLINE_BELOW_BYTES else min(16, len(os.sched_getaffinity(0)))
        self.workers = workers
        self.progress = options.progress if options.progress is not None else sys.stderr.isatty()

    def execute(self) -> Path:
        started = time.time()
        total = sum(p.size() for p in self.parts)
        # minutes of work on real files: said when it starts, even in a log with no bar; an input
        # small enough to parse inline takes a second or two, and a mistake in it stays one line
        said = total >= _INLINE_BELOW_BYTES
        if said:
            print(f"preprocessing {self.dataset} ({total / 2**20:,.1f} MiB of raw lines) into "
                  f"{self.out}: done once, reused after", file=sys.stderr, flush=True)  # fmt: skip
        pipeline = BlockPipeline(self.workers)
        try:
            if _has_vocabulary(self.categorical):
                table_sizes, vocab_summary = self._vocabulary(pipeline)
            else:
                table_sizes, vocab_summary = [self.categorical["max_ind_range"]] * NUM_SPARSE, None
            index_dtype = "int32" if max(table_sizes) <= 2**31 else "int64"
            records = self._encode(pipeline, index_dtype)
        finally:
            pipeline.close()
        self._write_meta(table_sizes, index_dtype, records, vocab_summary, started)
        shutil.rmtree(self.out / "counts", ignore_errors=True)
        if said:
            print(f"preprocessed {self.dataset} in {time.time() - started:.1f} s", file=sys.stderr,
                  flush=True)  # fmt: skip
        return self.out

    def _bar(self, parts: list[RawPart], what: str) -> tqdm:
        return tqdm(
            total=sum(p.size() for p in parts),
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc=what,
            disable=not self.progress,
            smoothing=0.1,
        )

    def _spec(self, part: RawPart, kind: str, index_dtype: str = "int64") -> TaskSpec:
        rate = self.options.sub_sample_rate if part.train else 0.0
        return TaskSpec(
            kind=kind,
            has_label=part.has_label,
            sub_sample_rate=rate,
            sub_sample_key=sub_sample_key(self.options.seed, part.name),
            max_ind_range=self.categorical.get("max_ind_range", 0),
            vocab_dir=str(self.out / "vocab") if _has_vocabulary(self.categorical) else None,
            index_dtype=index_dtype,
        )

    # --- frequency mode: count, then build the id maps -------------------------------------------

    def _vocabulary(self, pipeline: BlockPipeline) -> tuple[list[int], list[dict]]:
        vocab_dir = self.out / "vocab"
        marker = vocab_dir / "done.json"
        if marker.is_file():
            record = dm.read_json(marker)
            if record.get("fingerprint") == self.settings:
                return record["table_sizes"], record["summary"]
        counts_dir = self.out / "counts"
        counts_dir.mkdir(exist_ok=True)
        labelled = [p for p in self.parts if p.has_label]
        todo = [p for p in labelled if not self._counted(counts_dir, p)]
        total = FrequencyCounter(NUM_SPARSE)
        with self._bar(todo, "counting") as bar:
            for part in todo:
                counter = FrequencyCounter(NUM_SPARSE)
                bad = BadLineLog(part, self.options.on_bad_line, log=False)  # logged when encoding

                def take(result: TaskResult, counter=counter, bad=bad) -> None:
                    bad.take(result)
                    for f, (values, counts) in enumerate(result.counts):
                        counter.add(f, values, counts)

                pipeline.run(part, self._spec(part, "count"), self.options.block_bytes, take, bar)
                bad.check_total()
                counter.save(counts_dir / f"{part.name}.npz")
                dm.write_json(counts_dir / f"{part.name}.done.json", {"fingerprint": self.settings})
        for part in labelled:
            total.update(FrequencyCounter.load(counts_dir / f"{part.name}.npz", NUM_SPARSE))
        forget_vocabularies()
        if self.categorical["mode"] == "hash":  # contiguous: every value seen keeps a row
            sizes, summary = Vocabulary.write_contiguous(vocab_dir, total)
        else:
            sizes, summary = Vocabulary.write(vocab_dir, total, self.categorical["threshold"])
        dm.write_json(
            marker, {"fingerprint": self.settings, "table_sizes": sizes, "summary": summary}
        )
        return sizes, summary

    def _counted(self, counts_dir: Path, part: RawPart) -> bool:
        marker = counts_dir / f"{part.name}.done.json"
        if not (marker.is_file() and (counts_dir / f"{part.name}.npz").is_file()):
            return False
        return dm.read_json(marker).get("fingerprint") == self.settings

    # --- encode every part ------------------------------------------------------------------------

    def _encode(self, pipeline: BlockPipeline, index_dtype: str) -> list[dict]:
        todo = []
        for part in self.parts:
            problem = dm.part_problem(self.out, part.name, self.settings, full=True)
            if problem is None:
                record = dm.read_json(dm.marker_path(self.out, part.name))
                dm.check_bad_line_policy(
                    str(dm.marker_path(self.out, part.name)),
                    sum(record["bad_lines"].values()),
                    self.options.on_bad_line,
                )
                logger.info("%s: already done and verified, skipped", part.name)
            else:
                logger.info("%s: %s; writing it", part.name, problem)
                todo.append(part)
        with self._bar(todo, "preprocessing") as bar:
            for part in todo:
                self._encode_part(pipeline, part, index_dtype, bar)
        return [dm.read_json(dm.marker_path(self.out, p.name)) for p in self.parts]

    def _encode_part(
        self, pipeline: BlockPipeline, part: RawPart, index_dtype: str, bar: tqdm
    ) -> None:
        dm.marker_path(self.out, part.name).unlink(missing_ok=True)
        writers = {
            "dense": NpyWriter(
                dm.column_path(self.out, part.name, "dense"), np.float32, (NUM_DENSE,)
            )
        }
        writers["sparse"] = NpyWriter(
            dm.column_path(self.out, part.name, "sparse"), np.dtype(index_dtype), (NUM_SPARSE,)
        )
        if part.has_label:
            writers["labels"] = NpyWriter(dm.column_path(self.out, part.name, "labels"), np.int8)
        bad = BadLineLog(part, self.options.on_bad_line)
        started = time.time()

        def take(result: TaskResult) -> None:
            bad.take(result)
            writers["dense"].append(result.dense)
            writers["sparse"].append(result.sparse)
            if part.has_label:
                writers["labels"].append(result.labels)

        try:
            pipeline.run(
                part, self._spec(part, "encode", index_dtype), self.options.block_bytes, take, bar
            )
            bad.check_total()
            files = {column: w.finish() for column, w in writers.items()}
        except BaseException:
            for w in writers.values():
                w.abort()
            raise
        record = {
            "fingerprint": self.settings,
            "part": part.name,
            "source": {
                "file": part.path.name,
                "byte_start": part.byte_start,
                "byte_end": part.byte_end,
                "first_line": part.first_line,
            },
            "lines": bad.lines_before,
            "rows": writers["dense"].rows,
            "sub_sampled": part.train and self.options.sub_sample_rate > 0,
            "bad_lines": bad.counts,
            "bad_line_examples": bad.examples,
            "seconds": round(time.time() - started, 3),
            "files": files,
        }
        dm.write_json(dm.marker_path(self.out, part.name), record)

    # --- meta.json --------------------------------------------------------------------------------

    def _write_meta(self, table_sizes, index_dtype, records, vocab_summary, started) -> None:
        rows = {r["part"]: r["rows"] for r in records}
        days = [r["part"] for r in records if r["part"].startswith("day_")]
        last = days[-1]
        test, val = split_halves(rows[last])
        splits = {
            "train": [{"part": d, "start": 0, "stop": rows[d]} for d in days[:-1]],
            "test": [{"part": last, "start": 0, "stop": test}],
            "val": [{"part": last, "start": test, "stop": test + val}],
        }
        if "inference" in rows:
            splits["inference"] = [{"part": "inference", "start": 0, "stop": rows["inference"]}]
        bad_total = dict.fromkeys(BAD_REASONS, 0)
        for r in records:
            for reason, n in r["bad_lines"].items():
                bad_total[reason] += n
        options = asdict(self.options)
        options["test_raw"] = None if self.options.test_raw is None else str(self.options.test_raw)
        meta = {
            "format": dm.FORMAT,
            "format_version": dm.FORMAT_VERSION,
            "dataset": self.dataset,
            "settings": self.settings,
            "num_dense": NUM_DENSE,
            "num_sparse": NUM_SPARSE,
            "dense_names": DENSE_NAMES,
            "sparse_names": SPARSE_NAMES,
            "feature_names": FEATURE_NAMES,
            "table_sizes": table_sizes,
            "index_dtype": index_dtype,
            "dense_transform": "log(max(x, 0) + 1) as float32; an empty field is 0",
            "categorical": _describe_categorical(self.categorical, vocab_summary),
            "labels": "int8 0/1; the unlabelled inference part has no labels file",
            "parts": [
                {
                    "name": r["part"],
                    "rows": r["rows"],
                    "lines": r["lines"],
                    "has_labels": "labels" in r["files"],
                    "sub_sampled": r["sub_sampled"],
                    "bad_lines": r["bad_lines"],
                    "source": r["source"],
                }
                for r in records
            ],
            "splits": splits,
            "split_convention": (
                "reference (facebookresearch/dlrm): all days but the last train; the last day's "
                "first ceil(rows/2) rows are the test split, the rest validation (torchrec's "
                "Kaggle recipe uses the opposite halves)"
            ),
            "rows": {
                name: sum(s["stop"] - s["start"] for s in segs) for name, segs in splits.items()
            },
            "bad_lines": bad_total,
            "raw": self.identity,
            "options": options,
            "made_by": {
                "tool": "python -m data_pipeline preprocess",
                "python": platform.python_version(),
                "numpy": np.__version__,
                "workers": self.workers,
                "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "seconds": round(time.time() - started, 3),
            },
        }
        dm.write_json(self.out / "meta.json", meta)


def _has_vocabulary(categorical: dict) -> bool:
    """Whether ids come through a vocabulary counted first (frequency mode, contiguous hash)."""
    return categorical["mode"] == "frequency" or bool(categorical.get("contiguous"))


def _describe_categorical(categorical: dict, vocab_summary: list[dict] | None) -> dict:
    if categorical.get("contiguous"):
        return {
            **categorical,
            "ids": (
                "each feature's distinct value % max_ind_range in the labelled days, by ascending "
                "value (an empty field counts as value 0); a value never seen there shares the "
                "row of value 0, or row 0"
            ),
            "vocab_dir": "vocab",
            "per_feature": vocab_summary,
        }
    if categorical["mode"] == "hash":
        return {
            **categorical,
            "ids": "value % max_ind_range; an empty field counts as value 0 (as the reference)",
        }
    return {
        **categorical,
        "ids": (
            "0 = empty field, 1 = seen fewer than threshold times in the labelled days or never, "
            "then by descending count, ties by ascending value"
        ),
        "vocab_dir": "vocab",
        "per_feature": vocab_summary,
    }


def ensure_preprocessed(dataset: str, raw_path: str | Path, out_dir: str | Path, **options) -> Path:
    """Preprocess on first use, finish an interrupted run, or reuse a complete result.

    `options` are PreprocessOptions fields (max_ind_range, frequency_threshold,
    sub_sample_rate, seed, on_bad_line, test_raw, workers, block_bytes, progress). Raises
    DataError if `out_dir` was made with different options or from different raw files.
    """
    return preprocess(dataset, raw_path, out_dir, PreprocessOptions(**options))

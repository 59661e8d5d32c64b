"""Multi-hot bags materialised from a preprocessed one-hot Criteo directory, as MLPerf's
DLRM-DCNv2 does (docs/data.md#multi-hot-bags).

MLPerf's materialisation (torchrec's DLRM example, `multi_hot.py` and
`scripts/materialize_synthetic_multihot_dataset.py`, as mlcommons/training recommendation_v2
runs it) gives table t of n_t rows and bag size k_t a lookup table [n_t, k_t]: column 0 is the
row id itself, columns 1 .. k_t-1 are drawn once per row, uniformly from [0, n_t)
(`randint`) or as `int(pareto(a=0.25)) % n_t`; a sample's bag for one-hot id i is row i of that
table. So a bag is a fixed function of the one-hot id: the same id always brings the same
companions, and the one-hot id is always in its own bag.

Here the same function, without the table: the draw for (table t, row i, column j) comes from a
counter-based hash of (seed, t, j, i) instead of the j-th number of one Mersenne-Twister stream,
so it needs no [n_t, k_t] table in memory (MLPerf's sizes make 32 GB of it for table 20 alone),
any row can be computed alone, and the result does not depend on numpy's legacy generator. The
ids differ from MLPerf's files (ours come from our own preprocessing anyway); the distribution
of a bag is the same. Pareto: numpy's `pareto(a)` is Lomax, (1-u)^(-1/a) - 1; the reference casts
it to int32, whose overflow is platform-defined: here it saturates at 2^31 - 1 before `% n_t`.

The result is its own dataset directory, written once and reused:

    OUT/meta.json              written last (format, the source directory and its parts' CRCs,
                               sizes, distribution, seed, per part its values file's record)
    OUT/day_N.values.npy       int32|int64 [rows, sum(k)]: a sample's bags, table by table
    OUT/lengths.npy            int32 [26]: ids per bag, per table (every bag of a table has k_t)

It is made under `.OUT.tmp-PID` and renamed to OUT only when complete (hybrid_dlrm/common/atomic.publish),
so a killed materialisation (kill -9 included) leaves a hidden temporary that is never read and
that the next materialisation removes; two processes materialising the same OUT take turns on a
lock (hybrid_dlrm/common/lock.py) and the second reuses the first's result.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numba
import numpy as np

from hybrid_dlrm.common import atomic
from hybrid_dlrm.common.crc import crc_hex, file_crc32
from hybrid_dlrm.common.header import check_header
from hybrid_dlrm.common.lock import DirectoryLock, LockError, LockHeld
from hybrid_dlrm.common.manifest import record_problem
from hybrid_dlrm.common.outputs import Purpose, check_output

from .bag_memory import check_bags
from .criteo_directory import CriteoDataset
from .dataset_meta import describe_difference, marker_path, read_json
from .errors import DataError, unwritable_dir, write_error
from .npy_stream import NpyWriter, check_file, first_id_outside
from .synthetic import _hash32, _mix64

log = logging.getLogger(__name__)

FORMAT = "hybrid-dlrm/criteo-multi-hot"
FORMAT_VERSION = 1
DISTRIBUTIONS = ("uniform", "pareto")
PARETO_SHAPE = 0.25  # MLPerf's `np.random.pareto(a=0.25)`
_INT32_MAX = 2**31 - 1
BLOCK_ROWS = 1 << 16  # samples whose bags are made at once


@numba.njit(cache=True)
def _bag_row(sparse, r, n_rows, table_of, column_of, keys, pareto, out):
    """out[r, c] for every bag column c (of table table_of[c], position column_of[c] in its
    bag): the one-hot id at position 0, a hashed draw elsewhere."""
    for c in range(out.shape[1]):
        t = table_of[c]
        i = sparse[r, t]
        if column_of[c] == 0:
            out[r, c] = i
            continue
        h1 = _hash32(i + keys[c, 0])
        h2 = _hash32(h1 + keys[c, 1])
        u = ((h1 << 21) + (h2 >> 11) + 0.5) * 1.1102230246251565e-16  # 53 bits in (0, 1)
        n = n_rows[t]
        if pareto:
            x = (1.0 - u) ** (-1.0 / PARETO_SHAPE) - 1.0
            out[r, c] = (int(x) if x < _INT32_MAX else _INT32_MAX) % n
        else:
            out[r, c] = min(int(u * n), n - 1)


@numba.njit(cache=True, parallel=True)
def _bags_parallel(sparse, n_rows, table_of, column_of, keys, pareto, out):
    for r in numba.prange(sparse.shape[0]):
        _bag_row(sparse, r, n_rows, table_of, column_of, keys, pareto, out)


# a batch's bags, made in the loader's threads: numba's workqueue threading layer must not be
# entered from two threads at once, and a batch is too small to need it
@numba.njit(cache=True)
def _bags_serial(sparse, n_rows, table_of, column_of, keys, pareto, out):
    for r in range(sparse.shape[0]):
        _bag_row(sparse, r, n_rows, table_of, column_of, keys, pareto, out)


class BagSpec:
    """What a materialisation makes: per table the bag size, the distribution, the seed. Given
    to CriteoBatchSource in place of a MultiHotDataset, it makes each batch's bags as the batch
    is loaded (`--multi-hot-materialize false`): the same bags, no disk, CPU per batch."""

    materialised = False

    def __init__(
        self,
        sizes: list[int],
        table_sizes: list[int],
        distribution: str = "uniform",
        seed: int = 0,
        flags: tuple[str, str] = ("--multi-hot-sizes", "--multi-hot-distribution"),
    ) -> None:
        if distribution not in DISTRIBUTIONS:
            raise DataError(
                f"{flags[1]}: expected one of {', '.join(DISTRIBUTIONS)}, got {distribution!r}"
            )
        if len(sizes) != len(table_sizes) or min(sizes) < 1:
            raise DataError(
                f"{flags[0]}: expected one size >= 1 per categorical feature "
                f"({len(table_sizes)}), got {len(sizes)}"
            )
        self.sizes = [int(k) for k in sizes]
        self.flags = flags
        self.table_sizes = [int(n) for n in table_sizes]
        self.distribution, self.seed = distribution, int(seed)
        self.table_of = np.repeat(np.arange(len(sizes)), self.sizes).astype(np.int64)
        self.column_of = np.concatenate([np.arange(k) for k in self.sizes]).astype(np.int64)
        keys = np.empty((len(self.table_of), 2), dtype=np.int64)
        for c, (t, j) in enumerate(zip(self.table_of, self.column_of)):
            x = _mix64(_mix64(_mix64(self.seed) ^ int(t)) ^ int(j))
            keys[c] = (x & 0x7FFFFFFF, (x >> 32) & 0x7FFFFFFF)
        self.keys = keys

    def to_json(self) -> dict:
        return {"sizes": self.sizes, "distribution": self.distribution, "seed": self.seed}

    def bags(self, sparse: np.ndarray, parallel: bool = True) -> np.ndarray:
        """The bags [n, sum(sizes)] of one-hot ids `sparse` [n, tables] (ids in their tables)."""
        out = np.empty((len(sparse), len(self.table_of)), dtype=sparse.dtype)
        args = (
            np.ascontiguousarray(sparse), np.array(self.table_sizes, dtype=np.int64),
            self.table_of, self.column_of, self.keys, self.distribution == "pareto", out,
        )  # fmt: skip
        if not parallel:
            _bags_serial(*args)
            return out
        import torch  # loaded already (the trainer; the CLI, by criteo_dataset): its thread count

        threads = torch.get_num_threads()
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        _bags_parallel(*args)
        # as synthetic.py's chunk: numba's OpenMP layer resets the process's OpenMP thread count
        torch.set_num_threads(threads)
        return out


def default_directory(processed: str | Path, spec: BagSpec) -> Path:
    """Beside the preprocessed directory, named by what it holds, so several coexist:
    `DIR.multihot-uniform-1a2b3c4d` (the CRC-32 of the sizes and seed)."""
    processed = Path(processed)
    tag = crc_hex(f"{'-'.join(map(str, spec.sizes))} seed {spec.seed}".encode())
    return processed.with_name(f"{processed.name}.multihot-{spec.distribution}-{tag}")


def _source_record(source: CriteoDataset) -> dict:
    """What ties a materialisation to its one-hot source: meta.json's CRC-32 and each part's
    sparse column record (size, rows, CRC-32) from its preprocessing marker."""
    parts = {}
    for part in source.meta["parts"]:
        files = read_json(marker_path(source.directory, part["name"])).get("files", {})
        parts[part["name"]] = files.get("sparse")
    return {
        "directory": str(source.directory.resolve()),
        "meta_crc32": file_crc32(source.directory / "meta.json"),
        "parts": parts,
    }


def _values_path(out: Path, part: str) -> Path:
    return out / f"{part}.values.npy"


# what materialise writes: a directory, complete once it has meta.json (then it is reused)
MULTI_HOT_DIRECTORY = Purpose(
    "multi-hot data set directory", directory=True, identify=lambda d: (d / "meta.json").is_file()
)


def materialise(
    source_dir: str | Path, out: str | Path, spec: BagSpec, wait_s: float = 1.0
) -> Path:
    """Make OUT from the preprocessed one-hot `source_dir`, or reuse it when it matches; a
    directory made from other data or with other sizes is refused (one DataError)."""
    source, out = CriteoDataset(source_dir), Path(out)
    check_bags(spec.flags[0], spec.sizes, BLOCK_ROWS, "materialising the bags")
    if spec.table_sizes != source.table_sizes:
        raise DataError(
            f"{source_dir}: its tables ({len(source.table_sizes)}) are not the ones the bags "
            "were asked for"
        )
    wanted = {"spec": spec.to_json(), "source": _source_record(source)}
    if (out / "meta.json").is_file():
        return _reuse(out, wanted)
    problem = unwritable_dir(out.parent)
    if problem:  # checked first: the lock file could not be made there either
        raise DataError(unwritable_place(problem, source_dir))
    # about to write (also where no --out named it: the directory beside the preprocessed one)
    check_output(out, "the multi-hot directory", MULTI_HOT_DIRECTORY,
                 protected={"the preprocessed directory": source_dir}, error=DataError)  # fmt: skip
    lock = DirectoryLock(out.parent, name=f".{out.name}.lock")
    try:  # another living process materialising the same directory: wait, then reuse its result
        lock.acquire_waiting(
            "--multi-hot-sizes",
            lambda pid: log.warning("%s: process %s is materialising it; waiting", out, pid),
            poll_s=wait_s,
        )
    except LockHeld as e:  # held by no living process: nothing to wait for
        raise DataError(str(e)) from None
    except LockError as e:  # the place cannot be written after all (EROFS, EACCES)
        raise DataError(unwritable_place(str(e), source_dir)) from None
    try:
        if (out / "meta.json").is_file():
            return _reuse(out, wanted)
        if out.exists():
            raise DataError(
                f"{out}: exists but is not a complete multi-hot data set (no meta.json); "
                "delete it or choose another directory"
            )
        for leftover in out.parent.glob(f".{out.name}.tmp-*"):  # of a killed materialisation
            shutil.rmtree(leftover, ignore_errors=True)
        tmp = atomic.temporary(out)
        tmp.mkdir()
        try:
            _write(source, tmp, spec, wanted)
            atomic.publish(tmp, out)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise write_error(e, out, "multi-hot bags") from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    finally:
        lock.release()
    log.info("materialised multi-hot bags %s", out)
    return out


def unwritable_place(problem: str, source_dir: str | Path) -> str:
    """The one line for bags that cannot be written where they go, with both ways around it."""
    return (
        f"{problem} (where the multi-hot bags go); materialise them in a writable place "
        f"(python -m data_pipeline multi-hot {source_dir} --out DIR) or make them per batch "
        "(--multi-hot-materialize false)"
    )


def _write(source: CriteoDataset, tmp: Path, spec: BagSpec, wanted: dict) -> None:
    parts = []
    for part in source.meta["parts"]:
        name = part["name"]
        _, _, sparse = source.columns(name)  # verified against its marker on first use
        writer = NpyWriter(_values_path(tmp, name), sparse.dtype, (len(spec.table_of),))
        for lo in range(0, len(sparse), BLOCK_ROWS):
            writer.append(spec.bags(np.asarray(sparse[lo : lo + BLOCK_ROWS])))
        record = writer.finish()
        parts.append({"name": name, "rows": record["rows"], "values": record})
        log.info("multi-hot bags: %s done (%d rows)", name, record["rows"])
    lengths = tmp / "lengths.npy"
    with atomic.atomic_write(lengths) as f:
        np.save(f, np.array(spec.sizes, dtype=np.int32), allow_pickle=False)
    meta = {
        "format": FORMAT, "format_version": FORMAT_VERSION, **wanted,
        "table_sizes": spec.table_sizes, "feature_names": source.feature_names,
        "parts": parts, "lengths": {"bytes": lengths.stat().st_size,
                                    "crc32": file_crc32(lengths)},
    }  # fmt: skip
    atomic.write_json(tmp / "meta.json", meta)


def _load_meta(out: Path) -> dict:
    path = out / "meta.json"
    meta = read_json(path)
    check_header(meta, path, format=FORMAT, versions=(FORMAT_VERSION,), kind="data set format",
                 what="multi-hot data set", error=DataError, version_key="format_version")  # fmt: skip
    return meta


def _reuse(out: Path, wanted: dict) -> Path:
    meta = _load_meta(out)
    old = {"spec": meta.get("spec"), "source": meta.get("source")}
    if old["spec"] != wanted["spec"]:
        raise DataError(
            f"{out}: holds other multi-hot bags ({describe_difference(old['spec'], wanted['spec'])})"
            "; delete it or choose another directory"
        )
    # the directory the source lives in may move: the data is what must match
    if old["source"]["parts"] != wanted["source"]["parts"]:
        raise DataError(
            f"{out}: was materialised from other one-hot data than {wanted['source']['directory']} "
            f"({describe_difference(old['source']['parts'], wanted['source']['parts'])}); "
            "delete it to materialise again"
        )
    for part in meta["parts"]:  # sizes only here; each file's CRC-32 before its first use
        problem = check_file(_values_path(out, part["name"]), part["values"], full=False)
        if problem:
            raise DataError(f"{out}: {problem}; delete it to materialise again")
    log.info("reusing multi-hot bags %s", out)
    return out


class MultiHotDataset:
    """An opened multi-hot directory: per part its [rows, sum(k)] bags, memory-mapped and
    checked (CRC-32 and every id inside its table) before a part's first use."""

    materialised = True

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.meta = _load_meta(self.directory)
        lengths = self.directory / "lengths.npy"
        problem = record_problem(lengths, self.meta["lengths"], source="meta.json")
        if problem:
            raise DataError(f"{lengths}: {problem}; delete {self.directory} to materialise again")
        self.sizes = np.load(lengths, allow_pickle=False).astype(np.int64)
        if self.sizes.tolist() != self.meta["spec"]["sizes"]:
            raise DataError(f"{lengths}: its sizes are not meta.json's")
        self.table_sizes = list(self.meta["table_sizes"])
        self._parts = {p["name"]: p for p in self.meta["parts"]}
        self._values: dict[str, np.ndarray] = {}

    def values(self, part: str) -> np.ndarray:
        if part not in self._values:
            if part not in self._parts:
                raise DataError(f"{self.directory}: has no part {part!r}")
            path = _values_path(self.directory, part)
            problem = check_file(path, self._parts[part]["values"], full=True)
            if problem:
                raise DataError(
                    f"{path}: {problem.removeprefix(path.name + ': ')}: it changed after "
                    f"materialisation; delete {self.directory} to materialise again"
                )
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
            limits = np.repeat(self.table_sizes, self.sizes)
            bad = first_id_outside(arr, limits)
            if bad is not None:
                raise DataError(f"{path}: row {bad[0]}: id {int(arr[bad])} outside its table")
            self._values[part] = np.asarray(arr)
        return self._values[part]

"""Access profiles: how often each embedding row is looked up, measured on a sample of the data.

    profiler = AccessProfiler(table_sizes, feature_names)
    for kjt in sampled_batches:
        profiler.add_kjt(kjt)            # or add_indices(table, ids) / add_rows(ids [n, T])
    profile = profiler.finish(sample_rate=0.05)
    profile.save("profile.npz")          # .npz, no pickle; AccessProfile.load reads it back
    profile.summary()                    # skew per table: top-1%/10% share, max/median, Zipf fit

Counting is one `np.bincount` per table and batch. Besides the counts, the profile keeps the first
`keep_inputs` inputs it saw (their ids, jagged: lengths [T, n] + values), so that a placement plan
can report the share of inputs whose lookups are all hot, measured on the sample.

`python -m embeddings.profile` profiles `.npy` id files ([rows, tables] integer arrays, such as
a preprocessed dataset's `*.sparse.npy`) or summarises / plots a saved profile.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from embeddings.errors import ProfileError, npz_failure
from hybrid_dlrm.common import cli_lines
from hybrid_dlrm.common.atomic import atomic_write
from hybrid_dlrm.common.header import check_header
from hybrid_dlrm.common.outputs import (
    Purpose,
    check_output,
    npz_format_is,
    png_made_for,
    png_marker,
)

if TYPE_CHECKING:  # torchrec costs seconds to import: the CLI and the planner do not need it
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

log = logging.getLogger(__name__)

FORMAT = "hybrid-dlrm/access-profile"
VERSION = 1
DEFAULT_KEEP_INPUTS = 65536
# what `--out` / `--profile-file` and `--plot` write (hybrid_dlrm/common/outputs.py): an existing
# profile or plot of ours is replaced, anything else needs --overwrite
PROFILE_FILE = Purpose("access profile", identify=npz_format_is(FORMAT))
PROFILE_PLOT = Purpose("profile plot PNG", identify=png_made_for("profile plot PNG"))
_INT32_MAX = 2**31 - 1


def _count_array(c: np.ndarray) -> np.ndarray:
    """Counts as stored when int32 or int64 (older profiles: int64), other integers as int64."""
    return c if c.dtype in (np.int32, np.int64) else c.astype(np.int64)


def line_look(table: int) -> tuple[str, str]:
    """(colour, line style) of a table's line: matplotlib cycles 10 colours, so past them a line
    style tells tables apart (Criteo's 26 tables, up to 40 distinct)."""
    return f"C{table % 10}", ("-", "--", ":", "-.")[(table // 10) % 4]


@dataclass
class AccessProfile:
    feature_names: list[str]
    table_sizes: list[int]
    counts: list[np.ndarray]  # per table, int32 [rows] (int64 past 2**31 - 1 lookups): each row's
    inputs: int  # inputs (samples) counted
    sample_rate: float = 0.0  # the share of the data the sample was (informational)
    sample_lengths: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int32))  # [T, n]
    sample_values: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # table-major

    @property
    def num_tables(self) -> int:
        return len(self.table_sizes)

    @property
    def kept_inputs(self) -> int:
        return int(self.sample_lengths.shape[1]) if self.sample_lengths.ndim == 2 else 0

    def lookups(self) -> list[int]:
        return [int(c.sum()) for c in self.counts]

    # --- summary ------------------------------------------------------------------------------

    def table_summary(self, t: int) -> dict:
        c = self.counts[t]
        n = int(c.size)
        total = int(c.sum())
        seen = c[c > 0]
        desc = np.sort(seen)[::-1]
        cum = np.cumsum(desc, dtype=np.int64)

        def top_share(frac: float) -> float:
            if total == 0:
                return 0.0
            k = min(max(1, math.ceil(frac * n)), desc.size)
            return float(cum[k - 1] / total) if k > 0 else 0.0

        med = float(np.median(seen)) if seen.size else 0.0
        return {
            "feature": self.feature_names[t],
            "rows": n,
            "lookups": total,
            "rows_seen": int(seen.size),
            "top1pct_share": top_share(0.01),
            "top10pct_share": top_share(0.10),
            "max_over_median": float(desc[0] / med) if seen.size else None,
            "zipf_alpha": fit_zipf(desc),
        }

    def summary(self) -> dict:
        tables = [self.table_summary(t) for t in range(self.num_tables)]
        return {
            "inputs": self.inputs,
            "sample_rate": self.sample_rate,
            "lookups": sum(t["lookups"] for t in tables),
            "rows": sum(self.table_sizes),
            "rows_seen": sum(t["rows_seen"] for t in tables),
            "tables": tables,
        }

    # --- files --------------------------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "feature_names": self.feature_names,
            "table_sizes": self.table_sizes,
            "inputs": self.inputs,
            "sample_rate": self.sample_rate,
        }
        arrays = {f"counts_{t}": c for t, c in enumerate(self.counts)}
        with atomic_write(path) as f:
            np.savez(
                f,
                meta=np.array(json.dumps(meta)),
                sample_lengths=self.sample_lengths,
                sample_values=self.sample_values,
                **arrays,
            )
        return path

    @classmethod
    def load(cls, path: str | Path) -> AccessProfile:
        path = Path(path)
        if not path.is_file():
            raise ProfileError(f"{path}: no such profile file")
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(str(z["meta"]))
                check_header(meta, path, format=FORMAT, versions=(VERSION,), kind="profile",
                             what="access profile", error=ProfileError)  # fmt: skip
                sizes = [int(n) for n in meta["table_sizes"]]
                counts = [np.asarray(z[f"counts_{t}"]) for t in range(len(sizes))]
                lengths, values = np.asarray(z["sample_lengths"]), np.asarray(z["sample_values"])
        except ProfileError:
            raise
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
            raise ProfileError(
                f"{path}: not a readable access profile ({npz_failure(e)})"
            ) from None
        for t, (c, n) in enumerate(zip(counts, sizes)):
            if c.dtype.kind not in "iu" or c.shape != (n,):
                raise ProfileError(
                    f"{path}: counts of table {t} must be {n} integers, got {c.dtype} {c.shape}"
                )
        if lengths.dtype.kind not in "iu" or values.dtype.kind not in "iu":
            raise ProfileError(f"{path}: the kept sample must hold integers")
        return cls(
            list(meta["feature_names"]), sizes, [_count_array(c) for c in counts], int(meta["inputs"]),
            float(meta.get("sample_rate", 0.0)), lengths.astype(np.int32), values.astype(np.int64),
        )  # fmt: skip

    def plot(self, path: str | Path) -> Path:
        """PNG of each table's access CDF: share of lookups against share of rows, hottest first."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 5))
        for t, c in enumerate(self.counts):
            desc = np.sort(c[c > 0])[::-1]
            if desc.size == 0:
                continue
            cum = np.cumsum(desc) / desc.sum()
            x = np.arange(1, desc.size + 1) / c.size
            step = max(1, desc.size // 2000)  # a few thousand points per line is plenty
            color, style = line_look(t)
            ax.plot(x[::step], cum[::step], lw=1, ls=style, color=color,
                    label=self.feature_names[t])  # fmt: skip
        ax.set_xscale("log")
        ax.set_xlabel("share of the table's rows (hottest first)")
        ax.set_ylabel("share of the table's lookups")
        ax.set_title(f"access CDF per table ({self.inputs} inputs)")
        if self.num_tables <= 30:
            ax.legend(fontsize=6, ncol=2)
        ax.grid(True, which="both", alpha=0.3)
        path = Path(path)
        with atomic_write(path) as f:  # never half a PNG, on a full disk or a Ctrl-C
            fig.savefig(f, format="png", dpi=120, bbox_inches="tight",
                        metadata=png_marker(PROFILE_PLOT))  # fmt: skip
        plt.close(fig)
        return path


def fit_zipf(desc_counts: np.ndarray, min_count: int = 5) -> float | None:
    """Zipf exponent: least-squares slope of log(count) on log(rank), over rows seen >= min_count
    times (below that the counts are too discrete to say anything about the tail)."""
    c = desc_counts[desc_counts >= min_count]
    if c.size < 3:
        return None
    x = np.log(np.arange(1, c.size + 1, dtype=np.float64))
    y = np.log(c.astype(np.float64))
    slope = np.polyfit(x, y, 1)[0]
    return float(-slope)


class AccessProfiler:
    """Accumulates per-table row counts (vectorised) and keeps the first inputs it sees."""

    def __init__(
        self,
        table_sizes: list[int],
        feature_names: list[str] | None = None,
        keep_inputs: int = DEFAULT_KEEP_INPUTS,
    ) -> None:
        self.table_sizes = [int(n) for n in table_sizes]
        self.feature_names = list(feature_names or [f"cat_{i}" for i in range(len(table_sizes))])
        if len(self.feature_names) != len(self.table_sizes):
            raise ProfileError(
                f"{len(self.table_sizes)} table sizes for {len(self.feature_names)} features"
            )
        # int32 counts: half the memory of int64 at Terabyte scale (260M rows: 1 GB, not 2);
        # a table past 2**31 - 1 lookups is promoted to int64 before it could overflow
        self.counts = [np.zeros(n, dtype=np.int32) for n in self.table_sizes]
        self._lookups = [0] * len(self.table_sizes)
        self.inputs = 0
        self.keep_inputs = int(keep_inputs)
        self._kept_lengths: list[np.ndarray] = []  # [T, b] blocks
        self._kept_values: list[list[np.ndarray]] = []  # per block, per table
        self._kept = 0

    def _count(self, t: int, ids: np.ndarray) -> None:
        if ids.size == 0:
            return
        if ids.dtype.kind not in "iu":
            raise ProfileError(
                f"feature {self.feature_names[t]}: ids must be integers, got {ids.dtype}"
            )
        lo, hi = int(ids.min()), int(ids.max())
        n = self.table_sizes[t]
        if lo < 0 or hi >= n:
            bad = lo if lo < 0 else hi
            raise ProfileError(
                f"feature {self.feature_names[t]}: id {bad} outside the table's {n} rows"
            )
        self._lookups[t] += ids.size
        if self._lookups[t] > _INT32_MAX and self.counts[t].dtype == np.int32:
            self.counts[t] = self.counts[t].astype(np.int64)
        if ids.size * 16 >= n:
            self.counts[t] += np.bincount(ids, minlength=n).astype(self.counts[t].dtype, copy=False)
        else:  # a big table and a small batch: do not sweep every row of the table
            rows, c = np.unique(ids, return_counts=True)
            self.counts[t][rows] += c

    def add_indices(self, t: int, ids: np.ndarray) -> None:
        """Count lookups of table `t` (no per-input structure: not kept for the input share)."""
        self._count(t, np.asarray(ids).reshape(-1))

    def add_rows(self, rows: np.ndarray) -> None:
        """Inputs with one lookup per feature: an integer array [n_inputs, n_tables]."""
        rows = np.asarray(rows)
        if rows.ndim != 2 or rows.shape[1] != len(self.table_sizes):
            raise ProfileError(
                f"expected ids of shape [inputs, {len(self.table_sizes)}], got {list(rows.shape)}"
            )
        n = rows.shape[0]
        lengths = np.ones((len(self.table_sizes), n), dtype=np.int32)
        self._add_jagged(lengths, [np.ascontiguousarray(rows[:, t]) for t in range(rows.shape[1])])

    def add_kjt(self, kjt: KeyedJaggedTensor) -> None:
        """A batch's sparse features; keys are matched to the profiler's features by name."""
        keys = kjt.keys()
        missing = [f for f in self.feature_names if f not in keys]
        if missing:
            raise ProfileError(
                f"batch has no feature {missing[0]!r} (it has {', '.join(keys[:5])}...)"
            )
        if keys != self.feature_names:
            kjt = kjt.permute([keys.index(f) for f in self.feature_names])
        batch = kjt.stride()
        lengths = kjt.lengths().cpu().numpy().reshape(len(self.feature_names), batch)
        values = kjt.values().cpu().numpy()
        per_table = np.split(values, np.cumsum(lengths.sum(axis=1))[:-1])
        self._add_jagged(lengths.astype(np.int32), per_table)

    def _add_jagged(self, lengths: np.ndarray, per_table: list[np.ndarray]) -> None:
        for t, ids in enumerate(per_table):
            self._count(t, ids)
        n = lengths.shape[1]
        self.inputs += n
        take = min(n, self.keep_inputs - self._kept)
        if take > 0:
            self._kept_lengths.append(lengths[:, :take])
            self._kept_values.append(
                [ids[: int(lengths[t, :take].sum())] for t, ids in enumerate(per_table)]
            )
            self._kept += take

    def finish(self, sample_rate: float = 0.0) -> AccessProfile:
        """The profile; its counts are the profiler's own arrays (not copied: at Terabyte scale a
        copy is another GB), so the profiler is done."""
        T = len(self.table_sizes)
        if self._kept_lengths:
            lengths = np.concatenate(self._kept_lengths, axis=1).astype(np.int32)
            values = np.concatenate([blk[t] for t in range(T) for blk in self._kept_values]).astype(
                np.int64
            )  # table-major, blocks in order within each table
        else:
            lengths, values = np.zeros((T, 0), np.int32), np.zeros(0, np.int64)
        return AccessProfile(
            self.feature_names, self.table_sizes, self.counts, self.inputs,  # handed over, no copy
            float(sample_rate), lengths, values,
        )  # fmt: skip


# --- command line -----------------------------------------------------------------------------


def _id_files(paths: list[str]) -> tuple[list[Path], dict]:
    """`.npy` id files, or a directory with meta.json and `*.sparse.npy` columns."""
    files: list[Path] = []
    meta: dict = {}
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.glob("*.sparse.npy"))
            if not found:
                raise ProfileError(f"{p}: no *.sparse.npy id files in this directory")
            files += found
            if (p / "meta.json").is_file():
                try:
                    meta = json.loads((p / "meta.json").read_text())
                except json.JSONDecodeError as e:
                    raise ProfileError(
                        f"{p / 'meta.json'}:{e.lineno}: not valid JSON ({e.msg})"
                    ) from None
        elif p.is_file():
            files.append(p)
        else:
            raise ProfileError(f"{p}: no such file or directory")
    return files, meta


def profile_npy_files(
    paths: list[str],
    table_sizes: list[int] | None,
    sample_rate: float,
    seed: int = 0,
    feature_names: list[str] | None = None,
    chunk: int = 1 << 20,
) -> AccessProfile:
    files, meta = _id_files(paths)
    table_sizes = table_sizes or meta.get("table_sizes")
    feature_names = feature_names or meta.get("feature_names")
    rng = np.random.default_rng(seed)
    arrays = []
    for f in files:
        try:
            a = np.load(f, mmap_mode="r", allow_pickle=False)
        except ValueError as e:
            raise ProfileError(f"{f}: not a readable .npy file ({npz_failure(e)})") from None
        if a.ndim != 2 or a.dtype.kind not in "iu":
            raise ProfileError(
                f"{f}: expected an integer array [rows, tables], got {a.dtype} {list(a.shape)}"
            )
        arrays.append((f, a))
    if table_sizes is None:
        # Without sizes, the largest id seen decides: rows beyond it are never looked up anyway.
        table_sizes = list(
            np.max(np.stack([np.asarray(a.max(axis=0)) for _, a in arrays]), axis=0) + 1
        )
    profiler = AccessProfiler(list(table_sizes), feature_names, keep_inputs=DEFAULT_KEEP_INPUTS)
    for f, a in arrays:
        if a.shape[1] != len(table_sizes):
            raise ProfileError(f"{f}: {a.shape[1]} columns for {len(table_sizes)} tables")
        for lo in range(0, a.shape[0], chunk):
            hi = min(lo + chunk, a.shape[0])
            if sample_rate >= 1.0:
                rows = np.asarray(a[lo:hi])
            else:
                pick = np.flatnonzero(rng.random(hi - lo) < sample_rate) + lo
                rows = np.asarray(a[pick])
            profiler.add_rows(rows.astype(np.int64, copy=False))
    return profiler.finish(sample_rate)


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split("-")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected dash-separated row counts like 1000-50-7, got {text!r}"
        ) from None
    if min(sizes) < 1:
        raise argparse.ArgumentTypeError("every table needs at least one row")
    return sizes


def _rate(text: str) -> float:
    try:
        r = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}") from None
    if not 0.0 < r <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}")
    return r


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    cli_lines.log_to_stderr("python -m embeddings.profile")
    p = _Parser(prog="python -m embeddings.profile", description=__doc__.splitlines()[0])
    p.add_argument(
        "inputs",
        nargs="+",
        help=".npy id files [rows, tables], a dataset directory, or one saved profile .npz",
    )
    p.add_argument(
        "--table-sizes",
        type=_sizes,
        help="rows per table, dash-separated (default: meta.json or max id + 1)",
    )
    p.add_argument("--profile-sample-rate", "--sample-rate", type=_rate, default=0.05, dest="rate",
                   help="share of the inputs to count (default 0.05)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the profile here (.npz)")
    p.add_argument("--plot", help="write a PNG of the per-table access CDF here")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --out or --plot file this command did not write")  # fmt: skip
    args = p.parse_args(argv)
    inputs = [("the input", Path(i)) for i in args.inputs]
    for flag, target, purpose in (
        ("--out", args.out, PROFILE_FILE),
        ("--plot", args.plot, PROFILE_PLOT),
    ):
        if target:  # before the profiling, which may take minutes
            try:
                check_output(target, flag, purpose, protected=inputs, overwrite=args.overwrite)
            except ValueError as e:
                p.error(str(e))
    try:
        if len(args.inputs) == 1 and args.inputs[0].endswith(".npz"):
            profile = AccessProfile.load(args.inputs[0])
        else:
            profile = profile_npy_files(args.inputs, args.table_sizes, args.rate, args.seed)
        if args.out:
            profile.save(args.out)
        if args.plot:
            profile.plot(args.plot)
    except ProfileError as e:
        sys.stderr.write(f"{p.prog}: error: {e}\n")
        return 2
    except OSError as e:  # writing --out or --plot (a full disk, say)
        sys.stderr.write(f"{p.prog}: error: {e.filename}: cannot be written ({e.strerror})\n")
        return 2
    print(json.dumps(profile.summary(), indent=1))
    return 0


if __name__ == "__main__":
    from hybrid_dlrm.common import endings  # Ctrl-C / SIGTERM: one line, exit 130 / 143

    sys.exit(endings.run(main, left=lambda: "nothing written"))  # its writes are atomic

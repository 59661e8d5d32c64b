"""Synthetic raw Criteo files, in the Kaggle and the Terabyte layouts, with every quirk.

The rows look like the real logs: empty fields at per-feature rates, negative integers (-1, -2,
...), occasional long integers, 8-hex-digit categoricals of which about half are >= 2**31,
skewed (Zipf-like) categorical popularity, and a label planted from a few dense and categorical
features so a model can learn it (AUC well above 0.5). Malformed lines of each kind can be
injected at known line numbers, so tests can check the reports.

Everything is vectorised: a row becomes a fixed-width byte matrix in which unused slots hold a
marker byte that is dropped at the end, so writing a 1 GB file takes seconds, not minutes.
"""

from __future__ import annotations

import gzip
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hybrid_dlrm.common.atomic import atomic_write

from .criteo_format import CAT_MISSING, INT_MISSING, NUM_DENSE, NUM_SPARSE

# Distinct values per feature in the real Kaggle data, used (capped) as vocabulary sizes.
KAGGLE_CARDINALITIES = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip
# Rough per-feature rates of empty fields in the real data.
DENSE_MISSING = (0.45, 0.0, 0.21, 0.22, 0.03, 0.22, 0.04, 0.0, 0.04, 0.45, 0.04, 0.77, 0.22)
SPARSE_MISSING = (0.0,) * 2 + (0.03,) * 2 + (0.12, 0.0, 0.0, 0.0) + (0.0,) * 10 + (
    0.44, 0.44, 0.0, 0.77, 0.0, 0.03, 0.44, 0.44,
)  # fmt: skip

_DEL = 0xFF  # marker for unused byte slots
_INT_SLOT = 13  # '-' and up to 12 digits
_DIGITS4 = np.frombuffer(b"".join(f"{i:04d}".encode() for i in range(10000)), dtype="<u4")
_POW10 = 10 ** np.arange(1, _INT_SLOT - 1, dtype=np.int64)  # 10 .. 10**11
_POW16 = 16 ** np.arange(1, 8, dtype=np.int64)
_SLOTS = np.arange(_INT_SLOT - 1)
_M64 = (1 << 64) - 1


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on uint64 (wrapping arithmetic): a cheap, well-spread hash."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@dataclass(frozen=True)
class SyntheticSpec:
    """What the generated rows look like. Same spec and seed -> same bytes."""

    seed: int = 0
    vocab_cap: int = 100_000  # vocabulary per feature: min(real cardinality, cap)
    vocab_sizes: tuple[int, ...] | None = None  # overrides the capped real cardinalities
    dense_missing: tuple[float, ...] = DENSE_MISSING
    sparse_missing: tuple[float, ...] = SPARSE_MISSING
    negative_rate: float = 0.02  # integers written as -1, -2, ...
    long_int_rate: float = 0.002  # integers with 9 to 12 digits
    short_hex_rate: float = 0.0  # categoricals written without leading zeros (not in real data)
    upper_hex_rate: float = 0.0  # categoricals in upper case (not in real data)
    positive_bias: float = -1.6  # logit offset: about 25% positives, like Kaggle

    def vocab(self) -> np.ndarray:
        sizes = self.vocab_sizes or tuple(min(c, self.vocab_cap) for c in KAGGLE_CARDINALITIES)
        if len(sizes) != NUM_SPARSE:
            raise ValueError(f"vocab_sizes needs {NUM_SPARSE} entries, got {len(sizes)}")
        return np.asarray(sizes, dtype=np.int64)


@dataclass
class RawRows:
    """Ground truth of generated rows, in the parser's representation."""

    labels: np.ndarray | None  # int8 [n]
    ints: np.ndarray  # int64 [n, 13], INT_MISSING where empty
    cats: np.ndarray  # int64 [n, 26], CAT_MISSING where empty
    short_hex: np.ndarray  # bool [n, 26]: written without leading zeros
    upper_hex: np.ndarray  # bool [n, 26]


def categorical_value(feature: int | np.ndarray, index: np.ndarray, seed: int = 0) -> np.ndarray:
    """The 32-bit value of vocabulary entry `index` of a feature (about half >= 2**31).

    `feature` may be an array broadcasting against `index` (e.g. arange(26) for [n, 26])."""
    f = np.asarray(feature, dtype=np.uint64) + np.uint64(1)
    key = f * np.uint64(0xD1B54A32D192ED03) + np.uint64((seed * 0x9E3779B97F4A7C15) & _M64)
    return (_mix(index.astype(np.uint64) + key) >> np.uint64(32)).astype(np.int64)


def generate_rows(n: int, spec: SyntheticSpec, stream: int, with_label: bool = True) -> RawRows:
    """n rows; `stream` separates independent blocks/files of the same spec."""
    rng = np.random.default_rng([spec.seed, stream])
    # Dense: heavy-tailed counts, some negative, some long, some empty.
    ints = np.floor(np.exp(rng.normal(1.0, 1.6, size=(n, NUM_DENSE)))).astype(np.int64) - 1
    ints = np.maximum(ints, 0)
    neg = rng.random((n, NUM_DENSE)) < spec.negative_rate
    ints[neg] = -rng.integers(1, 4, size=int(neg.sum()))
    long_ = rng.random((n, NUM_DENSE)) < spec.long_int_rate
    ints[long_] = rng.integers(10**8, 10**12, size=int(long_.sum()))
    ints[rng.random((n, NUM_DENSE)) < np.asarray(spec.dense_missing)] = INT_MISSING
    # Sparse: log-uniform (Zipf-like) index into each feature's vocabulary.
    vocab = spec.vocab()
    idx = np.exp(rng.random((n, NUM_SPARSE)) * np.log(vocab + 1.0)).astype(np.int64) - 1
    idx = np.minimum(idx, vocab - 1)
    cats = categorical_value(np.arange(NUM_SPARSE), idx, spec.seed)
    cats[rng.random((n, NUM_SPARSE)) < np.asarray(spec.sparse_missing)] = CAT_MISSING
    labels = None
    if with_label:
        dense = np.log1p(np.maximum(ints, 0).astype(np.float64))
        # Each value of three categoricals pushes the logit by a fixed, hash-derived amount.
        logit = spec.positive_bias + 0.35 * (dense[:, 0] - 1.0) - 0.25 * (dense[:, 5] - 1.5)
        for f in (0, 5, 13):
            h = _mix(cats[:, f].astype(np.uint64) + np.uint64(f)) >> np.uint64(40)
            logit += np.where(cats[:, f] < 0, 0.0, h.astype(np.float64) / 2**24 * 3.0 - 1.5)
        labels = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int8)
    return RawRows(
        labels=labels,
        ints=ints,
        cats=cats,
        short_hex=rng.random((n, NUM_SPARSE)) < spec.short_hex_rate,
        upper_hex=rng.random((n, NUM_SPARSE)) < spec.upper_hex_rate,
    )


def _hex_chars(c: np.ndarray) -> np.ndarray:
    """uint64 values < 2**32 -> 8 lower-case hex digits each, as uint64 (bytes in text order)."""
    x = (c | (c << np.uint64(16))) & np.uint64(0x0000FFFF0000FFFF)
    x = (x | (x << np.uint64(8))) & np.uint64(0x00FF00FF00FF00FF)
    x = (x | (x << np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)  # one nibble per byte
    over9 = ((x + np.uint64(0x0606060606060606)) >> np.uint64(4)) & np.uint64(0x0101010101010101)
    x += np.uint64(0x3030303030303030)
    x += over9 * np.uint64(ord("a") - ord("0") - 10)
    return x.byteswap()  # most significant nibble first


def format_rows(rows: RawRows) -> bytes:
    """The rows as TSV lines, vectorised (a byte matrix with deletion markers)."""
    n = len(rows.ints)
    has_label = rows.labels is not None
    width = (2 if has_label else 0) + NUM_DENSE * (_INT_SLOT + 1) + NUM_SPARSE * 9
    m = np.full((n, width), _DEL, dtype=np.uint8)
    col = 0
    if has_label:
        m[:, 0] = rows.labels + ord("0")
        m[:, 1] = ord("\t")
        col = 2
    dense = m[:, col : col + NUM_DENSE * (_INT_SLOT + 1)].reshape(n, NUM_DENSE, _INT_SLOT + 1)
    v = rows.ints
    missing = v == INT_MISSING
    mag = np.where(missing, 0, np.abs(v))
    # Digits four at a time through a table (integer % is slow in numpy; // is not).
    hi = mag // 10**8
    mid = mag // 10**4
    groups = np.stack([hi, mid - hi * 10**4, mag - mid * 10**4], axis=-1)
    digits = _DIGITS4[groups].view(np.uint8).reshape(n, NUM_DENSE, _INT_SLOT - 1)
    ndig = np.searchsorted(_POW10, mag, side="right") + 1  # exact digit count (0 has 1)
    keep = _SLOTS >= (_INT_SLOT - 1 - ndig)[..., None]
    keep &= ~missing[..., None]
    dense[:, :, 1:_INT_SLOT] = np.where(keep, digits, _DEL)
    dense[:, :, 0] = np.where((v < 0) & ~missing, ord("-"), _DEL)
    dense[:, :, _INT_SLOT] = ord("\t")
    col += NUM_DENSE * (_INT_SLOT + 1)
    sparse = m[:, col:].reshape(n, NUM_SPARSE, 9)
    c = np.where(rows.cats < 0, 0, rows.cats).astype(np.uint64)
    sparse[:, :, :8] = _hex_chars(c).view(np.uint8).reshape(n, NUM_SPARSE, 8)
    if rows.upper_hex.any():
        up = rows.upper_hex[..., None] & (sparse[:, :, :8] >= ord("a"))
        sparse[:, :, :8] -= np.where(up, 32, 0).astype(np.uint8)
    if rows.short_hex.any():  # drop leading zeros, keep at least one digit
        nhex = np.searchsorted(_POW16, c.astype(np.int64), side="right") + 1
        drop = rows.short_hex[..., None] & (_SLOTS[:8] < (8 - nhex)[..., None])
        sparse[:, :, :8][drop] = _DEL
    sparse[rows.cats < 0, :8] = _DEL
    sparse[:, :, 8] = ord("\t")
    m[:, -1] = ord("\n")
    return m[m != _DEL].tobytes()


# --- malformed lines ------------------------------------------------------------------------------


def _corrupt(line: bytes, reason: str, rng: np.random.Generator, has_label: bool) -> bytes:
    fields = line.split(b"\t")
    first_int = 1 if has_label else 0
    if reason == "field_count":
        return b"\t".join(fields[:-1] if rng.random() < 0.5 else fields + [b"0"])
    if reason == "label":
        fields[0] = [b"2", b"", b"x", b"-1", b"01"][rng.integers(5)]
    elif reason == "integer":
        f = first_int + int(rng.integers(NUM_DENSE))
        fields[f] = [b"1.5", b"+3", b"12a", b"--1", b"-", b" 7", b"1234567890123456789"][
            rng.integers(7)
        ]
    elif reason == "categorical":
        f = first_int + NUM_DENSE + int(rng.integers(NUM_SPARSE))
        fields[f] = [b"xyz00000", b"123456789", b"12 45678", b"-1234567", b"0x12"][rng.integers(5)]
    else:
        raise ValueError(f"unknown malformed-line kind {reason!r}")
    return b"\t".join(fields)


@dataclass
class RawFileInfo:
    path: Path
    lines: int
    bytes: int  # uncompressed
    bad_lines: list[tuple[int, str]] = field(default_factory=list)  # (1-based line, reason)


def write_raw_file(
    path: str | Path,
    num_lines: int,
    spec: SyntheticSpec = SyntheticSpec(),
    *,
    stream: int = 0,
    with_label: bool = True,
    bad_lines: Mapping[str, int] | None = None,
    compress: bool = False,
    block_lines: int = 100_000,
    final_newline: bool = True,
) -> RawFileInfo:
    """Write num_lines synthetic lines (gzip if `compress`); `bad_lines` maps a kind
    ('field_count', 'label', 'integer', 'categorical') to how many lines to corrupt."""
    path = Path(path)
    rng = np.random.default_rng([spec.seed, stream, 1 << 20])
    planted: dict[int, str] = {}
    for reason, count in (bad_lines or {}).items():
        free = np.setdiff1d(np.arange(num_lines), np.fromiter(planted, dtype=np.int64))
        for line in rng.choice(free, size=min(count, len(free)), replace=False):
            planted[int(line)] = reason
    total = 0
    # compresslevel 1: a fast writer matters more here than the size of test files
    with (
        atomic_write(path) as raw,
        gzip.GzipFile(path.name, "wb", 1, raw) if compress else nullcontext(raw) as out,
    ):
        for b, lo in enumerate(range(0, num_lines, block_lines)):
            hi = min(num_lines, lo + block_lines)
            data = format_rows(generate_rows(hi - lo, spec, stream * 1_000_003 + b, with_label))
            here = sorted(k for k in planted if lo <= k < hi)
            if here:
                lines = data.split(b"\n")
                for k in here:
                    lines[k - lo] = _corrupt(lines[k - lo], planted[k], rng, with_label)
                data = b"\n".join(lines)
            if hi == num_lines and not final_newline:
                data = data[:-1]
            out.write(data)
            total += len(data)
    return RawFileInfo(path, num_lines, total, [(k + 1, planted[k]) for k in sorted(planted)])


def write_kaggle(
    out_dir: str | Path,
    train_lines: int,
    test_lines: int = 0,
    spec: SyntheticSpec = SyntheticSpec(),
    *,
    bad_lines: Mapping[str, int] | None = None,
) -> dict[str, RawFileInfo]:
    """`train.txt` (labelled) and, if test_lines, an unlabelled `test.txt`, as Kaggle ships them."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {"train": write_raw_file(out / "train.txt", train_lines, spec, bad_lines=bad_lines)}
    if test_lines:
        files["test"] = write_raw_file(
            out / "test.txt", test_lines, spec, stream=1, with_label=False
        )
    return files


def write_terabyte(
    out_dir: str | Path,
    lines_per_day: int | Sequence[int],
    spec: SyntheticSpec = SyntheticSpec(),
    *,
    days: int = 24,
    compressed_days: Sequence[int] = (),
    bad_lines: Mapping[int, Mapping[str, int]] | None = None,
) -> list[RawFileInfo]:
    """`day_0` .. `day_{days-1}` (`day_N.gz` for N in compressed_days), as Criteo ships them."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    counts = [lines_per_day] * days if isinstance(lines_per_day, int) else list(lines_per_day)
    infos = []
    for d, n in enumerate(counts):
        gz = d in compressed_days
        name = f"day_{d}" + (".gz" if gz else "")
        infos.append(
            write_raw_file(
                out / name, n, spec, stream=100 + d, compress=gz, bad_lines=(bad_lines or {}).get(d)
            )
        )
    return infos

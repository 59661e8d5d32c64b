"""The Criteo raw line format and its vectorised parser.

A line is `label \\t I1..I13 \\t C1..C26 \\n` (the Kaggle `test.txt` has no label), or ends with
`\\r\\n` (a file that went through Windows): the `\\r` before a newline is part of the line end,
never of the last field, in the reference and the fast path alike, and a line's offset is still
where it starts in the file. A `\\r` anywhere else is a bad field.

- label: exactly `0` or `1`;
- I1..I13: empty, or an optional `-` followed by 1 to 18 decimal digits (18 digits always fit
  an int64; longer numbers never occur in Criteo data and are rejected rather than wrapped);
- C1..C26: empty, or 1 to 8 hex digits (either case), i.e. a value in [0, 2**32).

Parsing never goes through Python per line. A block of lines is translated byte-wise
(`bytes.translate`) into small codes (digit value, hex value, separator, '-', other), the
separators are found with one `flatnonzero`, and each field is decoded from an 8-byte window
that ends at its separator, read as one little-endian uint64 and decoded SWAR-style (several
bytes per integer operation). Every field is validated in the same vectorised pass; only lines
found bad are re-read by the small pure-Python `check_line`, which says what is wrong. That
function is also the reference the property tests compare the fast path against.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from .errors import BadLine

NUM_DENSE = 13
NUM_SPARSE = 26
DENSE_NAMES = [f"I{i + 1}" for i in range(NUM_DENSE)]
SPARSE_NAMES = [f"C{i + 1}" for i in range(NUM_SPARSE)]
# KeyedJaggedTensor keys, in table order.
FEATURE_NAMES = [f"cat_{i}" for i in range(NUM_SPARSE)]

INT_MISSING = np.iinfo(np.int64).min  # an empty integer field (no 18-digit number reaches it)
CAT_MISSING = -1  # an empty categorical field (hex values are never negative)
MAX_INT_DIGITS = 18
MAX_HEX_DIGITS = 8

# Reasons a line is rejected; they key the bad-line counts in meta.json.
BAD_REASONS = ("field_count", "label", "integer", "categorical")

# --- byte codes after translation -------------------------------------------------------------
_TAB, _NL, _MINUS, _OTHER = 0x80, 0x81, 0x20, 0x40
_table = bytearray([_OTHER] * 256)
for _i, _c in enumerate(b"0123456789"):
    _table[_c] = _i
for _i, _c in enumerate(b"abcdef"):
    _table[_c] = 10 + _i
for _i, _c in enumerate(b"ABCDEF"):
    _table[_c] = 10 + _i
_table[ord("-")] = _MINUS
_table[ord("\t")] = _TAB
_table[ord("\n")] = _NL
TRANSLATE = bytes(_table)

_PAD = 32  # bytes before the block, so the windows of the first fields stay inside the buffer
_U = np.uint64
# KEEP[d]: keeps the last d bytes of an 8-byte window (the high bytes, little-endian).
_KEEP = np.array(
    [0] + [((1 << (8 * d)) - 1) << (8 * (8 - d)) for d in range(1, 9)], dtype=np.uint64
)
_HI_NIBBLES = _U(0xF0F0F0F0F0F0F0F0)
_SIX = _U(0x0606060606060606)
_POW8 = np.int64(10**8)
_POW16 = np.int64(10**16)

_LABEL_RE = re.compile(rb"[01]")
_INT_RE = re.compile(rb"-?[0-9]{1,%d}" % MAX_INT_DIGITS)
_HEX_RE = re.compile(rb"[0-9a-fA-F]{1,%d}" % MAX_HEX_DIGITS)


def num_fields(has_label: bool) -> int:
    return NUM_DENSE + NUM_SPARSE + (1 if has_label else 0)


@dataclass
class ParsedBlock:
    """The accepted rows of a block of lines, in line order.

    ints hold raw values (INT_MISSING where empty), cats raw hex values (CAT_MISSING where
    empty); `lines` is each row's 0-based line index in the block, `offsets` its byte offset.
    """

    labels: np.ndarray | None  # int8 [n], None for unlabeled input
    ints: np.ndarray  # int64 [n, 13]
    cats: np.ndarray  # int64 [n, 26]
    lines: np.ndarray  # int64 [n]
    offsets: np.ndarray  # int64 [n]: where each row's line starts in the block
    num_lines: int
    bad: list[BadLine] = field(default_factory=list)


# --- the reference (slow) path -----------------------------------------------------------------


def _show(value: bytes) -> str:
    """A field as an unambiguous one-line literal (control bytes escaped), cut if long."""
    text = repr(value[:40])
    return text + ("..." if len(value) > 40 else "")


def check_line(
    line: bytes, has_label: bool = True
) -> tuple[int | None, list[int], list[int]] | BadLine:
    """Parse one line (without its newline) the obvious way; the definition of a valid row.

    Returns (label, ints, cats) with INT_MISSING / CAT_MISSING for empty fields, or a BadLine
    (index 0) naming the first problem.
    """
    return _check_line(line[:-1] if line.endswith(b"\r") else line, has_label)


def _check_line(line: bytes, has_label: bool) -> tuple[int | None, list[int], list[int]] | BadLine:
    fields = line.split(b"\t")
    expected = num_fields(has_label)
    if len(fields) != expected:
        what = (
            "label, 13 integers, 26 categoricals" if has_label else "13 integers, 26 categoricals"
        )
        return BadLine(
            0,
            "field_count",
            f"expected {expected} tab-separated fields ({what}), found {len(fields)}",
        )
    label: int | None = None
    pos = 0
    if has_label:
        if _LABEL_RE.fullmatch(fields[0]) is None:
            return BadLine(
                0, "label", f"field 1 (label): expected 0 or 1, found {_show(fields[0])}"
            )
        label = int(fields[0])
        pos = 1
    ints: list[int] = []
    for i in range(NUM_DENSE):
        raw = fields[pos + i]
        if raw == b"":
            ints.append(int(INT_MISSING))
        elif _INT_RE.fullmatch(raw) is not None:
            ints.append(int(raw))
        else:
            return BadLine(
                0,
                "integer",
                f"field {pos + i + 1} ({DENSE_NAMES[i]}): expected an integer (optional '-' and "
                f"1 to {MAX_INT_DIGITS} digits) or nothing, found {_show(raw)}",
            )
    pos += NUM_DENSE
    cats: list[int] = []
    for i in range(NUM_SPARSE):
        raw = fields[pos + i]
        if raw == b"":
            cats.append(CAT_MISSING)
        elif _HEX_RE.fullmatch(raw) is not None:
            cats.append(int(raw, 16))
        else:
            return BadLine(
                0,
                "categorical",
                f"field {pos + i + 1} ({SPARSE_NAMES[i]}): expected 1 to {MAX_HEX_DIGITS} hex "
                f"digits or nothing, found {_show(raw)}",
            )
    return label, ints, cats


# --- SWAR decoders on uint64 windows -------------------------------------------------------------


def _decimal8(w: np.ndarray) -> np.ndarray:
    """Eight digit values (0..9, most significant in the lowest byte) -> their number."""
    v = w * _U(10)
    v += w >> _U(8)
    lo = (v & _U(0x000000FF000000FF)) * _U(100 + (1000000 << 32))
    hi = ((v >> _U(16)) & _U(0x000000FF000000FF)) * _U(1 + (10000 << 32))
    lo += hi
    lo >>= _U(32)
    return lo


def _hex8(w: np.ndarray) -> np.ndarray:
    """Eight nibble values (most significant in the lowest byte) -> their 32-bit number."""
    # Pairs of nibbles -> bytes, pairs of bytes -> 16 bits, pairs of those -> 32 bits; the sums
    # never carry because the shifted-in neighbour lands in bits the mask then clears.
    t = w << _U(4)
    t += w >> _U(8)
    t &= _U(0x00FF00FF00FF00FF)
    u = t << _U(8)
    u += t >> _U(16)
    u &= _U(0x0000FFFF0000FFFF)
    v = u << _U(16)
    v += u >> _U(32)
    v &= _U(0xFFFFFFFF)
    return v


def _all_decimal(w: np.ndarray) -> np.ndarray:
    # Every byte <= 9: high nibble clear, and still clear after adding 6 (10..15 carry into it).
    return ((w & _HI_NIBBLES) == 0) & (((w + _SIX) & _HI_NIBBLES) == 0)


def _windows(u64: np.ndarray, ends: np.ndarray, digits: np.ndarray, back: int) -> np.ndarray:
    """The 8 bytes ending `back` windows before each field end, keeping only its digits."""
    w = u64[ends - (8 + 8 * back)]
    w &= np.take(_KEEP, digits - 8 * back if back else digits, mode="clip")  # clip: 0..8
    return w


def _decode_ints(u64, codes, starts, ends):
    """Integer fields -> (int64 values with INT_MISSING, ok mask)."""
    length = ends - starts
    neg = (codes[starts] == _MINUS) & (length > 0)
    digits = length - neg
    w = _windows(u64, ends, digits, 0)
    ok = _all_decimal(w)
    value = _decimal8(w).view(np.int64)
    long_ = np.flatnonzero(digits > 8)
    if len(long_):  # rare: 9 to 18 digits need a second and third window
        e, d = ends.ravel()[long_], digits.ravel()[long_]
        w2 = _windows(u64, e, d, 1)
        w3 = _windows(u64, e, d, 2)
        flat_ok, flat_val = ok.reshape(-1), value.reshape(-1)
        flat_ok[long_] &= _all_decimal(w2) & _all_decimal(w3)
        flat_val[long_] += (
            _decimal8(w2).view(np.int64) * _POW8 + _decimal8(w3).view(np.int64) * _POW16
        )
    ok &= (digits >= 1) & (digits <= MAX_INT_DIGITS)
    np.negative(value, out=value, where=neg)
    empty = length == 0
    ok |= empty
    value[empty] = INT_MISSING
    return value, ok


def _decode_cats(u64, ends, length):
    """Categorical fields -> (int64 values with CAT_MISSING, ok mask)."""
    w = _windows(u64, ends, length, 0)
    ok = (w & _HI_NIBBLES) == 0
    ok &= length <= MAX_HEX_DIGITS
    value = _hex8(w).view(np.int64)
    empty = length == 0
    value[empty] = CAT_MISSING
    return value, ok


# --- the fast path ------------------------------------------------------------------------------


def _sub_block(data, codes, u64, lo, hi, has_label, out, row0, line0, bad):
    """Parse codes[lo:hi] (whole lines; positions include the front pad) into `out` from row
    `row0`; `line0` is the block line index of its first line. Returns (rows, lines)."""
    nf = num_fields(has_label)
    b = codes[lo:hi]
    seps = np.flatnonzero(b >= _TAB)
    seps += lo
    kinds = codes[seps]
    nl_idx = np.flatnonzero(kinds == _NL)
    nlines = len(nl_idx)
    starts = np.empty_like(seps)
    starts[0] = lo
    np.add(seps[:-1], 1, out=starts[1:])
    if len(seps) == nf * nlines and (nl_idx == np.arange(nf - 1, nf * nlines, nf)).all():
        line_ids = np.arange(nlines)
        ends, starts = seps.reshape(nlines, nf), starts.reshape(nlines, nf)
    else:  # some line has the wrong number of fields: set them aside, parse the rest
        counts = np.diff(nl_idx, prepend=-1)
        good = counts == nf
        line_starts = np.concatenate(([lo], seps[nl_idx[:-1]] + 1))
        for k in np.flatnonzero(~good):
            bad.append(_describe(data, line_starts[k], seps[nl_idx[k]], line0 + k, has_label))
        keep = np.repeat(good, counts)
        line_ids = np.flatnonzero(good)
        ends = seps[keep].reshape(-1, nf)
        starts = starts[keep].reshape(-1, nf)
    n = len(line_ids)
    if n == 0:
        return 0, nlines
    c0 = 1 if has_label else 0
    row_ok = np.ones(n, dtype=bool)
    if has_label:
        lab = codes[starts[:, 0]]
        row_ok &= (ends[:, 0] - starts[:, 0] == 1) & (lab <= 1)
    ints, ok = _decode_ints(
        u64, codes, starts[:, c0 : c0 + NUM_DENSE], ends[:, c0 : c0 + NUM_DENSE]
    )
    row_ok &= ok.all(axis=1)
    c1 = c0 + NUM_DENSE
    cat_ends = ends[:, c1:]
    cats, ok = _decode_cats(u64, cat_ends, cat_ends - starts[:, c1:])
    row_ok &= ok.all(axis=1)
    if not row_ok.all():
        for k in np.flatnonzero(~row_ok):
            bad.append(_describe(data, starts[k, 0], ends[k, -1], line0 + line_ids[k], has_label))
        line_ids, ints, cats = line_ids[row_ok], ints[row_ok], cats[row_ok]
        starts = starts[row_ok]
        if has_label:
            lab = lab[row_ok]
        n = len(line_ids)
    sl = slice(row0, row0 + n)
    if has_label:
        out.labels[sl] = lab
    out.ints[sl] = ints
    out.cats[sl] = cats
    out.lines[sl] = line_ids + line0
    out.offsets[sl] = starts[:, 0] - _PAD
    return n, nlines


def _describe(data, start, end, line_index, has_label) -> BadLine:
    """Ask the reference parser what is wrong with the line at codes[start:end]."""
    raw = bytes(data[start - _PAD : end - _PAD])
    result = _check_line(raw, has_label)  # its line end, \r included, is gone
    if not isinstance(result, BadLine):  # the fast path and the reference disagree: a bug
        raise AssertionError(f"parser rejected a valid line: {raw!r}")
    result.index = int(line_index)
    return result


def parse_block(
    data: bytes | bytearray, has_label: bool = True, sub_block_bytes: int = 1 << 18
) -> ParsedBlock:
    """Parse whole lines (`data` ends with a newline, or is empty) into arrays.

    Invalid lines are left out and described in `bad`; the caller decides whether that is an
    error. Works on sub-blocks of about `sub_block_bytes` so temporaries stay in cache.
    """
    if data and not data.endswith(b"\n"):
        raise ValueError("parse_block needs whole lines ending with a newline")
    if b"\r\n" in data:  # rare: parse the lines without their \r, then put the offsets back
        return _without_cr(data, has_label, sub_block_bytes)
    return _parse_lines(data, has_label, sub_block_bytes)


def _parse_lines(data: bytes | bytearray, has_label: bool, sub_block_bytes: int) -> ParsedBlock:
    num_lines = int(np.count_nonzero(np.frombuffer(data, dtype=np.uint8) == 10))
    out = ParsedBlock(
        labels=np.empty(num_lines, dtype=np.int8) if has_label else None,
        ints=np.empty((num_lines, NUM_DENSE), dtype=np.int64),
        cats=np.empty((num_lines, NUM_SPARSE), dtype=np.int64),
        lines=np.empty(num_lines, dtype=np.int64),
        offsets=np.empty(num_lines, dtype=np.int64),
        num_lines=num_lines,
    )
    if num_lines == 0:
        return out
    codes = np.empty(_PAD + len(data) + 8, dtype=np.uint8)
    codes[:_PAD] = 0
    codes[_PAD + len(data) :] = 0
    codes[_PAD : _PAD + len(data)] = np.frombuffer(data.translate(TRANSLATE), dtype=np.uint8)
    # Every unaligned 8-byte window of the buffer, as one uint64 (numpy copes with stride 1).
    u64 = np.ndarray((len(codes) - 7,), dtype="<u8", buffer=codes, strides=(1,))
    rows, line0, lo, end = 0, 0, 0, len(data)
    while lo < end:
        hi = data.rfind(b"\n", lo, lo + sub_block_bytes) + 1 if lo + sub_block_bytes < end else end
        if hi <= lo:  # one line longer than a sub-block
            hi = data.index(b"\n", lo) + 1
        n, lines = _sub_block(
            data, codes, u64, lo + _PAD, hi + _PAD, has_label, out, rows, line0, out.bad
        )
        rows += n
        line0 += lines
        lo = hi
    out.bad.sort(key=lambda b: b.index)
    if rows < num_lines:
        out.labels = out.labels[:rows] if has_label else None
        out.ints, out.cats = out.ints[:rows], out.cats[:rows]
        out.lines, out.offsets = out.lines[:rows], out.offsets[:rows]
    return out


def _without_cr(data: bytes | bytearray, has_label: bool, sub_block_bytes: int) -> ParsedBlock:
    raw = np.frombuffer(data, dtype=np.uint8)
    newlines = np.flatnonzero(raw == 10)
    cr = np.zeros(len(newlines), dtype=np.int64)
    inside = newlines > 0
    cr[inside] = raw[newlines[inside] - 1] == 13
    before = np.concatenate(([0], np.cumsum(cr)[:-1]))  # \r dropped before each line's start
    out = _parse_lines(bytes(data).replace(b"\r\n", b"\n"), has_label, sub_block_bytes)
    out.offsets += before[out.lines]
    return out


def dense_transform(ints: np.ndarray) -> np.ndarray:
    """log(max(x, 0) + 1) as float32; empty fields (INT_MISSING) and negatives give 0."""
    x = np.maximum(ints, 0).astype(np.float64)
    x += 1.0
    return np.log(x).astype(np.float32)

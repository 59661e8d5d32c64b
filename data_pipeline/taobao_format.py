"""The Alibaba/Taobao `UserBehavior.csv` line format and its vectorised parser.

A line is `user_id,item_id,category_id,behavior_type,timestamp` with no header:

- user_id, item_id, category_id, timestamp: 1 to 18 decimal digits (no sign; 18 digits always
  fit an int64);
- behavior_type: exactly one of `pv`, `buy`, `cart`, `fav`.

A `\\r` before the newline (a file saved on Windows) is accepted. Parsing never goes through
Python per line: newlines and commas are found with `flatnonzero`, a line must have exactly four
commas, and each numeric field is decoded from a right-aligned digit window with one matrix
product. Lines found bad are re-read by the small pure-Python `check_line`, which says what is
wrong; it is also the definition the tests compare the fast path against.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .errors import BadLine

BEHAVIORS = ("pv", "buy", "cart", "fav")
FIELDS = ("user_id", "item_id", "category_id", "behavior_type", "timestamp")
NUMERIC_FIELDS = (0, 1, 2, 4)
MAX_DIGITS = 18
# Reasons a line is rejected; they key the bad-line counts in meta.json.
BAD_REASONS = ("field_count", *FIELDS)

_POW10 = 10 ** np.arange(MAX_DIGITS - 1, -1, -1, dtype=np.int64)
_BEHAVIOR_KEYS = np.array(
    [int.from_bytes(b.encode().ljust(4, b"\0"), "little") for b in BEHAVIORS], dtype=np.uint32
)
_BEHAVIOR_LENGTHS = np.array([len(b) for b in BEHAVIORS], dtype=np.int64)


@dataclass
class ParsedRows:
    """Accepted rows of a block, in line order; `lines` is each row's 0-based line in the block."""

    users: np.ndarray  # int64 [n]
    items: np.ndarray  # int64 [n]
    categories: np.ndarray  # int64 [n]
    behaviors: np.ndarray  # int8 [n], index into BEHAVIORS
    timestamps: np.ndarray  # int64 [n]
    lines: np.ndarray  # int64 [n]
    num_lines: int
    bad: list[BadLine] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.users)


def _show(value: bytes) -> str:
    text = repr(value[:40])
    return text + ("..." if len(value) > 40 else "")


def check_line(line: bytes) -> tuple[int, int, int, int, int] | BadLine:
    """Parse one line (without its newline) the obvious way: (user, item, category, behavior
    index, timestamp), or a BadLine (index 0) naming the first problem."""
    if line.endswith(b"\r"):
        line = line[:-1]
    parts = line.split(b",")
    if len(parts) != len(FIELDS):
        return BadLine(0, "field_count", f"expected {len(FIELDS)} comma-separated fields "
                       f"({','.join(FIELDS)}), found {len(parts)}")  # fmt: skip
    values = []
    for i, (name, raw) in enumerate(zip(FIELDS, parts)):
        if i == 3:
            text = raw.decode("latin1")
            if text not in BEHAVIORS:
                return BadLine(
                    0, name, f"{name}: expected one of {', '.join(BEHAVIORS)}, got {_show(raw)}"
                )
            values.append(BEHAVIORS.index(text))
            continue
        if not (1 <= len(raw) <= MAX_DIGITS and raw.isdigit() and raw.isascii()):
            return BadLine(
                0, name, f"{name}: expected 1 to {MAX_DIGITS} decimal digits, got {_show(raw)}"
            )
        values.append(int(raw))
    return tuple(values)  # type: ignore[return-value]


def _decode_digits(
    buf: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(values, ok) of decimal fields buf[starts:ends]; ok is False where a field is empty, too
    long or holds a non-digit."""
    lengths = ends - starts
    width = int(min(lengths.max(initial=1), MAX_DIGITS))
    cols = np.arange(width, dtype=np.int64)
    # right-aligned window: column k holds the byte at ends - width + k
    pos = ends[:, None] - width + cols[None, :]
    inside = cols[None, :] >= (width - np.minimum(lengths, width))[:, None]
    digits = buf[np.clip(pos, 0, len(buf) - 1)].astype(np.int64) - 48
    digits = np.where(inside, digits, 0)
    ok = (lengths >= 1) & (lengths <= MAX_DIGITS) & ((digits >= 0) & (digits <= 9)).all(axis=1)
    values = digits @ _POW10[MAX_DIGITS - width :]
    return values, ok


def _decode_behaviors(
    buf: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    lengths = ends - starts
    cols = np.arange(4, dtype=np.int64)
    pos = starts[:, None] + cols[None, :]
    raw = np.where(cols[None, :] < lengths[:, None], buf[np.clip(pos, 0, len(buf) - 1)], 0)
    keys = raw.astype(np.uint32) @ (np.uint32(1) << (8 * cols.astype(np.uint32)))
    match = keys[:, None] == _BEHAVIOR_KEYS[None, :]
    which = match.argmax(axis=1)
    ok = match.any(axis=1) & (lengths == _BEHAVIOR_LENGTHS[which])
    return which.astype(np.int8), ok


def parse_block(data: bytes) -> ParsedRows:
    """Parse whole lines (`data` ends with a newline, or is empty)."""
    if b"\r" in data:
        data = data.replace(b"\r\n", b"\n")
    buf = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(buf == 10).astype(np.int64)
    if len(buf) and (len(ends) == 0 or ends[-1] != len(buf) - 1):
        raise ValueError("parse_block: data must end with a newline")
    starts = np.concatenate(([0], ends[:-1] + 1)).astype(np.int64)
    n = len(ends)
    commas = np.flatnonzero(buf == 44).astype(np.int64)
    first = np.searchsorted(commas, starts)
    count = np.searchsorted(commas, ends) - first
    good = count == 4
    g = np.flatnonzero(good)
    c = [commas[first[g] + k] for k in range(4)]
    field_starts = [starts[g], *(ci + 1 for ci in c)]
    field_ends = [*c, ends[g]]
    columns = []
    for i, (s, e) in enumerate(zip(field_starts, field_ends)):
        values, ok = (_decode_behaviors if i == 3 else _decode_digits)(buf, s, e)
        columns.append(values)
        good[g[~ok]] = False
    keep = good[g]
    rows = np.flatnonzero(good)
    bad = [_describe(data, int(starts[i]), int(ends[i]), int(i)) for i in np.flatnonzero(~good)]
    return ParsedRows(
        users=columns[0][keep],
        items=columns[1][keep],
        categories=columns[2][keep],
        behaviors=columns[3][keep],
        timestamps=columns[4][keep],
        lines=rows.astype(np.int64),
        num_lines=n,
        bad=bad,
    )


def _describe(data: bytes, start: int, end: int, index: int) -> BadLine:
    found = check_line(bytes(data[start:end]))
    if isinstance(found, BadLine):
        found.index = index
        return found
    # the fast path rejected a line the reference accepts: never silently drop it
    raise AssertionError(
        f"line {index}: the vectorised parser and check_line disagree on {bytes(data[start:end])!r}"
    )

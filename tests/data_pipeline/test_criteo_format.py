"""The raw line parser: exact values on hand-written quirky lines, exact rejection reasons, and
property tests that any byte line is parsed to exactly the reference row or rejected."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from data_pipeline.criteo_format import (
    CAT_MISSING,
    INT_MISSING,
    BadLine,
    check_line,
    dense_transform,
    parse_block,
)

M = INT_MISSING
E = CAT_MISSING

# Every quirk: empty fields, negatives, -0, leading zeros, 18-digit integers, hex >= 2**31,
# upper case and short hex, the largest and smallest hex values.
LINES = [
    (
        b"1\t5\t-1\t\t0\t007\t123456789012\t\t-2\t18\t\t-0\t1\t999999999999999999\t"
        b"68fd1e64\t80e26c9b\t\tFB936136\t7b4723c4\t1a\t0\tffffffff\t80000000\t7fffffff\t"
        b"a8cd5504\tb2cb9c98\t37c9c164\t2824a5f6\t1adce6ef\t8ba8b39a\t891b62e7\te5ba7672\t"
        b"f54016b9\t21ddcdc9\tb1252a9d\t07b5194c\t\t3a171ecb\tc5c50484\t",
        1,
        [5, -1, M, 0, 7, 123456789012, M, -2, 18, M, 0, 1, 999999999999999999],
        [0x68FD1E64, 0x80E26C9B, E, 0xFB936136, 0x7B4723C4, 0x1A, 0, 0xFFFFFFFF, 0x80000000,
         0x7FFFFFFF, 0xA8CD5504, 0xB2CB9C98, 0x37C9C164, 0x2824A5F6, 0x1ADCE6EF, 0x8BA8B39A,
         0x891B62E7, 0xE5BA7672, 0xF54016B9, 0x21DDCDC9, 0xB1252A9D, 0x07B5194C, E, 0x3A171ECB,
         0xC5C50484, E],
    ),
    (
        b"0" + b"\t" * 39,  # everything empty
        0,
        [M] * 13,
        [E] * 26,
    ),
    (
        b"0\t100000000\t99999999\t123456789\t-123456789\t1\t2\t3\t4\t5\t6\t7\t8\t9\t"
        + b"\t".join([b"00000001"] * 26),
        0,
        [100000000, 99999999, 123456789, -123456789, 1, 2, 3, 4, 5, 6, 7, 8, 9],
        [1] * 26,
    ),
]  # fmt: skip


def test_hand_written_lines_parse_exactly() -> None:
    data = b"".join(line + b"\n" for line, *_ in LINES)
    block = parse_block(data)
    assert block.bad == []
    assert block.num_lines == len(LINES)
    np.testing.assert_array_equal(block.labels, [lab for _, lab, _, _ in LINES])
    np.testing.assert_array_equal(block.ints, [ints for _, _, ints, _ in LINES])
    np.testing.assert_array_equal(block.cats, [cats for _, _, _, cats in LINES])
    np.testing.assert_array_equal(block.lines, [0, 1, 2])
    np.testing.assert_array_equal(
        block.offsets, [0, len(LINES[0][0]) + 1, len(LINES[0][0]) + len(LINES[1][0]) + 2]
    )
    for line, lab, ints, cats in LINES:
        assert check_line(line) == (lab, ints, cats)


def test_unlabelled_lines_have_39_fields() -> None:
    line = LINES[0][0][2:]  # drop "1\t"
    block = parse_block(line + b"\n", has_label=False)
    assert block.labels is None and block.bad == []
    np.testing.assert_array_equal(block.ints[0], LINES[0][2])
    np.testing.assert_array_equal(block.cats[0], LINES[0][3])
    rejected = parse_block(LINES[0][0] + b"\n", has_label=False)  # 40 fields: one too many
    assert [b.reason for b in rejected.bad] == ["field_count"]


@pytest.mark.parametrize(
    "field, value, reason",
    [
        (0, b"2", "label"),
        (0, b"", "label"),
        (0, b"01", "label"),
        (0, b" 1", "label"),
        (1, b"1.5", "integer"),
        (1, b"+3", "integer"),
        (1, b"-", "integer"),
        (1, b"--1", "integer"),
        (1, b"1-", "integer"),
        (1, b"a", "integer"),
        (1, b"1234567890123456789", "integer"),  # 19 digits
        (5, b"12 ", "integer"),
        (13, b"\r", "integer"),
        (14, b"123456789", "categorical"),  # 9 hex digits
        (14, b"g0000000", "categorical"),
        (20, b"-1", "categorical"),
        (20, b"0x12", "categorical"),
        (38, b"1234567\r", "categorical"),  # a \r that is not a line end
    ],
)
def test_each_kind_of_bad_field_is_rejected(field: int, value: bytes, reason: str) -> None:
    fields = LINES[0][0].split(b"\t")
    fields[field] = value
    line = b"\t".join(fields)
    data = LINES[1][0] + b"\n" + line + b"\n" + LINES[2][0] + b"\n"
    block = parse_block(data)
    assert [(b.index, b.reason) for b in block.bad] == [(1, reason)]
    assert f"field {field + 1} " in block.bad[0].message
    assert "\n" not in block.bad[0].message
    np.testing.assert_array_equal(block.lines, [0, 2])
    np.testing.assert_array_equal(block.ints, [LINES[1][2], LINES[2][2]])


def test_wrong_field_counts_and_empty_lines() -> None:
    good = LINES[2][0]
    data = b"\n".join([good, b"", good + b"\t1", good.rsplit(b"\t", 1)[0], good, b"x"]) + b"\n"
    block = parse_block(data)
    assert [(b.index, b.reason) for b in block.bad] == [
        (1, "field_count"),
        (2, "field_count"),
        (3, "field_count"),
        (5, "field_count"),
    ]
    assert "found 41" in block.bad[1].message and "found 39" in block.bad[2].message
    np.testing.assert_array_equal(block.lines, [0, 4])


def test_sub_blocks_do_not_change_the_result() -> None:
    rng = np.random.default_rng(0)
    lines = [LINES[int(i)][0] for i in rng.integers(0, 3, 300)]
    lines[17] = b"bad"
    data = b"\n".join(lines) + b"\n"
    whole = parse_block(data)
    for size in (1, 100, 1000, 4096):
        part = parse_block(data, sub_block_bytes=size)
        np.testing.assert_array_equal(part.ints, whole.ints)
        np.testing.assert_array_equal(part.cats, whole.cats)
        np.testing.assert_array_equal(part.lines, whole.lines)
        np.testing.assert_array_equal(part.offsets, whole.offsets)
        assert [b.index for b in part.bad] == [17]


def test_empty_block_and_missing_final_newline() -> None:
    assert parse_block(b"").num_lines == 0
    with pytest.raises(ValueError):
        parse_block(LINES[0][0])


def test_dense_transform() -> None:
    ints = np.array([[0, 1, -5, INT_MISSING, 999999999999999999, 7]], dtype=np.int64)
    out = dense_transform(ints)
    assert out.dtype == np.float32
    expected = [0.0, math.log(2), 0.0, 0.0, math.log(1e18), math.log(8)]
    np.testing.assert_allclose(out[0], expected, rtol=1e-6)


# --- property tests: the vectorised parser against the reference --------------------------------

_ALPHABET = list(b"0123456789abcdefABCDEF-+ .xgG\r\x00\x7f\x80\xff")
_noise = st.binary(max_size=10).map(lambda b: bytes(_ALPHABET[c % len(_ALPHABET)] for c in b))
_int_field = st.one_of(
    st.just(b""),
    st.integers(-(10**18) + 1, 10**18 - 1).map(lambda v: str(v).encode()),
    st.integers(-99, 99).map(lambda v: str(v).encode()),
    st.integers(0, 10**6).map(lambda v: b"-0" + str(v).encode()),
)
_hex_field = st.one_of(
    st.just(b""),
    st.integers(0, 2**32 - 1).map(lambda v: b"%08x" % v),
    st.integers(0, 2**32 - 1).map(lambda v: b"%x" % v),
    st.integers(0, 2**32 - 1).map(lambda v: b"%X" % v),
)
# Valid or not: around the length limits, wrong kinds, noise.
_edge = st.one_of(
    st.integers(10**17, 10**21).map(lambda v: str(v).encode()),
    st.integers(2**28, 2**40).map(lambda v: b"%x" % v),
)
_field = st.one_of(_int_field, _hex_field, _noise, _edge, st.sampled_from([b"0", b"1", b"2"]))


@st.composite
def _line(draw) -> bytes:
    """A mostly valid line, then up to two fields replaced by noise and sometimes a field
    added or dropped: both acceptance and each rejection path get exercised."""
    fields = [draw(st.sampled_from([b"0", b"1"]))]
    fields += draw(st.lists(_int_field, min_size=13, max_size=13))
    fields += draw(st.lists(_hex_field, min_size=26, max_size=26))
    for _ in range(draw(st.integers(0, 2))):
        fields[draw(st.integers(0, 39))] = draw(_field)
    change = draw(st.integers(0, 12))
    if change == 0:
        fields.pop(draw(st.integers(0, len(fields) - 1)))
    elif change == 1:
        fields.insert(draw(st.integers(0, len(fields))), draw(_field))
    if draw(st.booleans()):  # as an unlabelled (test.txt) line
        fields = fields[1:]
    return b"\t".join(fields)


def _assert_matches_reference(lines: list[bytes], has_label: bool, sub_block: int) -> int:
    """Compare with check_line; returns how many lines were accepted."""
    block = parse_block(b"".join(line + b"\n" for line in lines), has_label, sub_block)
    bad = {b.index: b for b in block.bad}
    rows = iter(range(len(block.lines)))
    for i, line in enumerate(lines):
        expected = check_line(line, has_label)
        if isinstance(expected, BadLine):
            assert i in bad, f"accepted a bad line {line!r}"
            assert bad[i].reason == expected.reason
            continue
        assert i not in bad, f"rejected {line!r}: {bad[i].message}"
        r = next(rows)
        assert block.lines[r] == i
        label, ints, cats = expected
        if has_label:
            assert block.labels[r] == label
        assert block.ints[r].tolist() == ints
        assert block.cats[r].tolist() == cats
    return len(block.lines)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_line(), min_size=1, max_size=6), st.booleans(), st.sampled_from([64, 1 << 19]))
def test_any_line_is_parsed_exactly_or_rejected(lines, has_label, sub_block) -> None:
    accepted = _assert_matches_reference(lines, has_label, sub_block)
    event(f"accepted {min(accepted, 1)}")


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.binary(max_size=60).map(lambda b: b.replace(b"\n", b"\t")), min_size=1, max_size=5)
)
def test_arbitrary_bytes_are_never_a_wrong_row(lines) -> None:
    _assert_matches_reference(lines, True, 1 << 19)
    _assert_matches_reference(lines, False, 1 << 19)


@pytest.mark.parametrize("sub_block", [64, 1 << 18])
def test_crlf_lines_parse_as_their_lf_lines_at_their_own_offsets(sub_block) -> None:
    # issue 37: \r\n is the Criteo line end's Windows variant, in both parsers
    lines = [line for line, *_ in LINES]
    lf = b"".join(line + b"\n" for line in lines)
    mixed = b"".join(line + (b"\r\n" if i % 2 == 0 else b"\n") for i, line in enumerate(lines))
    a, b = parse_block(lf, True, sub_block), parse_block(mixed, True, sub_block)
    assert b.bad == [] and b.num_lines == a.num_lines
    for name in ("labels", "ints", "cats", "lines"):
        np.testing.assert_array_equal(getattr(b, name), getattr(a, name))
    starts = [0]
    for i, line in enumerate(lines[:-1]):
        starts.append(starts[-1] + len(line) + (2 if i % 2 == 0 else 1))
    np.testing.assert_array_equal(b.offsets, starts)
    assert check_line(lines[0] + b"\r") == check_line(lines[0])
    # a \r before the end of the line is still a bad field
    bad = parse_block(lines[0] + b"\r\r\n")
    assert [x.reason for x in bad.bad] == ["categorical"]

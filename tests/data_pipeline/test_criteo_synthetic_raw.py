"""Synthetic raw Criteo writers: exact round trip through the parser, quirks present, malformed
lines where they say, both layouts."""

from __future__ import annotations

import gzip

import numpy as np

from data_pipeline.criteo_format import CAT_MISSING, INT_MISSING, check_line, parse_block
from data_pipeline.synthetic_raw import (
    SyntheticSpec,
    format_rows,
    generate_rows,
    write_kaggle,
    write_raw_file,
    write_terabyte,
)

QUIRKY = SyntheticSpec(seed=3, short_hex_rate=0.1, upper_hex_rate=0.1, long_int_rate=0.05)


def test_rows_round_trip_exactly_with_every_quirk() -> None:
    rows = generate_rows(5000, QUIRKY, stream=7)
    data = format_rows(rows)
    block = parse_block(data)
    assert block.bad == []
    np.testing.assert_array_equal(block.labels, rows.labels)
    np.testing.assert_array_equal(block.ints, rows.ints)
    np.testing.assert_array_equal(block.cats, rows.cats)
    # the quirks are really there
    assert (rows.ints == INT_MISSING).any() and (rows.cats == CAT_MISSING).any()
    assert ((rows.ints < 0) & (rows.ints != INT_MISSING)).any()
    assert (rows.ints >= 10**9).any()
    assert 0.3 < (rows.cats >= 2**31).mean() < 0.6
    assert b"\t\t" in data and b"\t-1\t" in data
    lines = data.split(b"\n")[:200]
    assert any(len(f) < 8 for line in lines for f in line.split(b"\t")[14:] if f)
    # the reference parser agrees line by line
    for i, line in enumerate(lines):
        label, ints, cats = check_line(line)
        assert (label, ints, cats) == (rows.labels[i], rows.ints[i].tolist(), rows.cats[i].tolist())


def test_unlabelled_rows_and_determinism() -> None:
    a = generate_rows(300, QUIRKY, stream=1, with_label=False)
    b = generate_rows(300, QUIRKY, stream=1, with_label=False)
    assert a.labels is None
    assert format_rows(a) == format_rows(b)
    block = parse_block(format_rows(a), has_label=False)
    assert block.bad == [] and (block.cats == a.cats).all()
    assert format_rows(generate_rows(300, QUIRKY, stream=2, with_label=False)) != format_rows(a)


def test_label_signal_is_planted() -> None:
    rows = generate_rows(20000, SyntheticSpec(), stream=0)
    assert 0.15 < rows.labels.mean() < 0.4
    dense0 = np.log1p(np.maximum(rows.ints[:, 0], 0))
    high = rows.labels[dense0 > np.median(dense0)].mean()
    low = rows.labels[dense0 <= np.median(dense0)].mean()
    assert high > low + 0.02


def test_malformed_lines_are_where_reported(tmp_path) -> None:
    bad = {"field_count": 3, "label": 3, "integer": 3, "categorical": 3}
    info = write_raw_file(tmp_path / "x.txt", 2500, QUIRKY, bad_lines=bad, block_lines=700)
    assert len(info.bad_lines) == 12
    lines = (tmp_path / "x.txt").read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 2501
    reported = {}
    for number, line in enumerate(lines[:-1], start=1):
        result = check_line(line)
        if not isinstance(result, tuple):
            reported[number] = result.reason
    assert reported == dict(info.bad_lines)


def test_layouts(tmp_path) -> None:
    files = write_kaggle(tmp_path / "k", 100, 40, QUIRKY)
    assert (tmp_path / "k" / "train.txt").read_bytes().count(b"\n") == 100
    test_lines = (tmp_path / "k" / "test.txt").read_bytes().split(b"\n")
    assert len(test_lines) == 41 and test_lines[0].count(b"\t") == 38
    assert files["test"].lines == 40
    infos = write_terabyte(tmp_path / "t", [5, 6, 7], QUIRKY, days=3, compressed_days=[1])
    assert [i.path.name for i in infos] == ["day_0", "day_1.gz", "day_2"]
    assert gzip.decompress((tmp_path / "t" / "day_1.gz").read_bytes()).count(b"\n") == 6
    write_raw_file(tmp_path / "n.txt", 3, QUIRKY, final_newline=False)
    assert not (tmp_path / "n.txt").read_bytes().endswith(b"\n")

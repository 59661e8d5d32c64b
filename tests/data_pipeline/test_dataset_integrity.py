"""A preprocessed dataset whose bytes changed on disk is named, never trained on."""

from __future__ import annotations

import gzip
import json
import shutil
import sys

import numpy as np
import pytest

from data_pipeline import dataset_meta as dm
from data_pipeline.__main__ import main as cli
from data_pipeline.criteo import CriteoDataset, PreprocessOptions, preprocess
from data_pipeline.errors import DataError
from data_pipeline.npy_stream import read_header
from data_pipeline.raw_files import comparable_identity, raw_identity
from data_pipeline.synthetic_raw import SyntheticSpec, write_kaggle, write_terabyte
from data_pipeline.taobao import TaobaoOptions, preprocess_taobao
from data_pipeline.taobao_dataset import TaobaoDataset
from data_pipeline.taobao_synthetic import PlantedBehavior, write_user_behavior


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    raw = tmp_path_factory.mktemp("raw")
    write_kaggle(raw, 7 * 41, 5, SyntheticSpec(seed=4, vocab_cap=300))
    out = tmp_path_factory.mktemp("out")
    return preprocess("kaggle", raw, out, PreprocessOptions(max_ind_range=10**9))


@pytest.fixture
def copy(made, tmp_path):
    dst = tmp_path / "data"
    shutil.copytree(made, dst)
    return dst


def first_part(ds: CriteoDataset) -> str:
    return ds.segments("train")[0][0]


@pytest.mark.parametrize("column", ["sparse", "dense", "labels"])
@pytest.mark.parametrize("where", [0.0, 0.5, 1.0])
def test_flipped_bytes_in_a_column_are_named(copy, column, where):
    part = first_part(CriteoDataset(copy))
    path = copy / f"{part}.{column}.npy"
    _, _, offset = read_header(path)
    raw = bytearray(path.read_bytes())
    at = offset + int(where * (len(raw) - offset - 16))
    for i in range(16):  # the 16 flipped bytes
        raw[at + i] ^= 0x5A
    path.write_bytes(bytes(raw))
    with pytest.raises(
        DataError, match=rf"{path.name}: checksum differs from its marker: it changed"
    ):
        CriteoDataset(copy).columns(part)


def test_ids_outside_their_table_are_named_with_file_row_and_feature(copy):
    ds = CriteoDataset(copy)
    part = first_part(ds)
    sparse = ds.columns(part)[2]
    col = int(np.argmax(sparse.max(axis=0)))  # a table whose largest id we make too large
    biggest = int(sparse[:, col].max())
    meta = json.loads((copy / "meta.json").read_text())
    meta["table_sizes"][col] = biggest  # the file's bytes are intact; the table is smaller
    (copy / "meta.json").write_text(json.dumps(meta))
    row = int(np.flatnonzero(sparse[:, col] == biggest)[0])
    name = ds.feature_names[col]
    with pytest.raises(
        DataError,
        match=rf"{part}.sparse.npy: row {row}: id {biggest} of {name} is outside its table "
        rf"\({biggest} rows\)",
    ):
        CriteoDataset(copy).columns(part)


def test_an_intact_dataset_opens(made):
    ds = CriteoDataset(made)
    assert ds.columns(first_part(ds))[2].shape[1] == 26


@pytest.fixture(scope="module")
def taobao_made(tmp_path_factory):

    root = tmp_path_factory.mktemp("taobao")
    raw = root / "UserBehavior.csv"
    write_user_behavior(raw, PlantedBehavior(num_users=60, min_events=8, max_events=12, seed=3))
    return preprocess_taobao(raw, root / "out", TaobaoOptions(ts_length=4, points_per_user=5))


def test_taobao_flipped_bytes_and_ids_outside_a_table_are_named(taobao_made, tmp_path):

    assert TaobaoDataset(taobao_made).columns("train")["items"].shape[1] == 5  # intact: opens
    copy = tmp_path / "tb"
    shutil.copytree(taobao_made, copy)
    path = copy / "train.items.npy"
    _, _, offset = read_header(path)
    raw = bytearray(path.read_bytes())
    raw[offset + 8] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(DataError, match="train.items.npy: checksum differs from its marker"):
        TaobaoDataset(copy).columns("train")
    shutil.rmtree(copy)
    shutil.copytree(taobao_made, copy)
    meta = json.loads((copy / "meta.json").read_text())
    meta["table_sizes"][meta["feature_names"].index("category")] = 1
    (copy / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(
        DataError,
        match=r"train.categories.npy: row \d+: id \d+ of category is outside its table \(1 rows\)",
    ):
        TaobaoDataset(copy).columns("train")


def test_taobao_raw_file_replaced_by_other_content_of_the_same_size_is_not_reused(
    taobao_made, tmp_path, caplog
):
    copy = tmp_path / "out"
    shutil.copytree(taobao_made, copy)
    raw = taobao_made.parent / "UserBehavior.csv"
    options = TaobaoOptions(ts_length=4, points_per_user=5)
    with caplog.at_level("INFO", logger="data_pipeline.taobao"):
        assert preprocess_taobao(raw, copy, options) == copy  # reused
    assert "raw file checked by size, CRC-32 of the first and last MiB" in caplog.text
    other = tmp_path / "UserBehavior.csv"
    data = bytearray(raw.read_bytes())
    data[len(data) // 2] = ord("7") if data[len(data) // 2] != ord("7") else ord("8")
    other.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"from another raw file \(raw\.crc32"):
        preprocess_taobao(other, copy, options)
    # made before content checksums: the name and size are what can be compared
    meta = json.loads((copy / "meta.json").read_text())
    meta["raw"] = {"name": "UserBehavior.csv", "bytes": len(data)}
    (copy / "meta.json").write_text(json.dumps(meta))
    assert preprocess_taobao(other, copy, options) == copy


@pytest.mark.parametrize("day, gz", [(23, False), (23, True), (5, True), (0, False)])
def test_an_empty_terabyte_day_is_one_error_before_any_work(tmp_path, day, gz):
    compressed = [day] if gz else []
    write_terabyte(tmp_path / "raw", 8, SyntheticSpec(seed=1), compressed_days=compressed)
    name = f"day_{day}" + (".gz" if gz else "")
    path = tmp_path / "raw" / name
    if gz:
        with gzip.open(path, "wb"):
            pass  # a valid gzip stream of nothing
    else:
        path.write_bytes(b"")
    with pytest.raises(DataError, match=rf"{name}: empty: every Terabyte day holds"):
        preprocess("terabyte", tmp_path / "raw", tmp_path / "out", PreprocessOptions())
    assert not (tmp_path / "out" / "meta.json").exists()


def test_raw_file_replaced_by_other_content_of_the_same_size_is_not_reused(tmp_path, caplog):
    raw = tmp_path / "raw"
    write_kaggle(raw, 7 * 20, 3, SyntheticSpec(seed=5, vocab_cap=100))
    opts = PreprocessOptions(max_ind_range=10**9)
    out = preprocess("kaggle", raw, tmp_path / "out", opts)
    with caplog.at_level("INFO", logger="data_pipeline.preprocess"):
        preprocess("kaggle", raw, out, opts)  # reused
    assert (
        "checked by size, CRC-32 of the first and last MiB, CRC-32 of the whole file" in caplog.text
    )
    train = raw / "train.txt"
    data = bytearray(train.read_bytes())
    data[len(data) // 2] = ord("7") if data[len(data) // 2] != ord("7") else ord("8")
    train.write_bytes(bytes(data))  # same size, other content
    with pytest.raises(DataError, match=r"was made from other raw files \(raw\.train\.txt\.crc32"):
        preprocess("kaggle", raw, out, opts)
    # made by the version before whole-file checksums: the edges are compared (a small file's
    # edges are all of it)
    meta = json.loads((out / "meta.json").read_text())
    meta["raw"] = {
        name: {k: v[k] for k in ("bytes", "edges_crc32")} for name, v in meta["raw"].items()
    }
    (out / "meta.json").write_text(json.dumps(meta))
    caplog.clear()
    with caplog.at_level("INFO", logger="data_pipeline.preprocess"):
        with pytest.raises(DataError, match=r"raw\.train\.txt\.edges_crc32"):
            preprocess("kaggle", raw, out, opts)
    assert "checked by size, CRC-32 of the first and last MiB" in caplog.text
    # a directory made before content checksums recorded sizes: those still match
    meta["raw"] = {name: v["bytes"] for name, v in meta["raw"].items()}
    (out / "meta.json").write_text(json.dumps(meta))
    caplog.clear()
    with caplog.at_level("INFO", logger="data_pipeline.preprocess"):
        assert preprocess("kaggle", raw, out, opts) == out
    assert "checked by size only" in caplog.text


def test_a_change_in_the_middle_of_a_larger_file_shows_in_its_whole_file_crc(tmp_path):
    path = tmp_path / "day_0"
    data = bytearray(np.random.default_rng(3).integers(0, 256, 3 << 20, dtype=np.uint8).tobytes())
    path.write_bytes(bytes(data))
    before = raw_identity(path)
    data[len(data) // 2] ^= 1  # beyond both edge MiBs
    path.write_bytes(bytes(data))
    after = raw_identity(path)
    assert before["bytes"] == after["bytes"] and before["edges_crc32"] == after["edges_crc32"]
    assert before["crc32"] != after["crc32"]
    assert comparable_identity({"bytes": 1, "edges_crc32": 2}, after) == {
        "bytes": after["bytes"],
        "edges_crc32": after["edges_crc32"],
    }


# (CRLF line ends are not damage: the Criteo files' line-end variant, read as their LF lines)
@pytest.mark.parametrize("damage", ["no tabs", "gzip named .txt"])
def test_skipping_bad_lines_when_every_line_is_bad_is_one_error(tmp_path, damage):
    raw = tmp_path / "raw"
    write_kaggle(raw, 7 * 10, 2, SyntheticSpec(seed=1, vocab_cap=50))
    train = raw / "train.txt"
    data = train.read_bytes()
    train.write_bytes(data.replace(b"\t", b" ") if damage == "no tabs" else gzip.compress(data))
    with pytest.raises(DataError, match=r"train.txt: day_0: none of its \d+ lines is usable"):
        preprocess("kaggle", raw, tmp_path / "out", PreprocessOptions(on_bad_line="skip"))


def test_counts_left_by_a_kill_after_meta_json_are_removed_on_reuse(tmp_path):
    raw = tmp_path / "raw"
    write_kaggle(raw, 7 * 10, 2, SyntheticSpec(seed=2, vocab_cap=50))
    out = preprocess("kaggle", raw, tmp_path / "out", PreprocessOptions(frequency_threshold=2))
    assert not (out / "counts").exists()
    (out / "counts").mkdir()  # as a kill between meta.json and their removal leaves them
    (out / "counts" / "day_0.npz").write_bytes(b"x" * 1000)
    assert preprocess("kaggle", raw, out, PreprocessOptions(frequency_threshold=2)) == out
    assert not (out / "counts").exists()


def test_a_full_disk_while_preprocessing_names_the_file_system(tmp_path, tmpfs):
    small_fs = tmpfs("size=256k")
    raw = tmp_path / "raw"
    write_kaggle(raw, 7 * 400, 2, SyntheticSpec(seed=3, vocab_cap=2000))
    with pytest.raises(
        DataError, match=rf"no space left on the file system mounted at {small_fs} "
    ):
        preprocess("kaggle", raw, small_fs / "out", PreprocessOptions(max_ind_range=10**9))
    out = small_fs / "out"
    for marker in out.glob("*.done.json"):  # the parts finished before the disk filled are intact
        part = marker.name.removesuffix(".done.json")
        assert (
            dm.part_problem(out, part, json.loads(marker.read_text())["fingerprint"], True) is None
        )
    assert not list(out.glob("*.tmp"))


def test_a_damaged_npy_header_is_named_without_numpys_unpickling_advice(copy):
    path = copy / f"{first_part(CriteoDataset(copy))}.sparse.npy"
    raw = bytearray(path.read_bytes())
    raw[:16] = bytes(b ^ 0x5A for b in raw[:16])  # no .npy magic: numpy takes it for a pickle
    path.write_bytes(bytes(raw))
    with pytest.raises(DataError) as e:
        CriteoDataset(copy).columns(first_part(CriteoDataset(copy)))
    assert f"{path}: cannot be read (its header is damaged" in str(e.value)
    assert "allow_pickle" not in str(e.value) and "pickle.load" not in str(e.value)


@pytest.mark.parametrize("content", [b"[]", b"\xff\xfe", b'{"format": '])
def test_a_damaged_json_record_is_one_line(copy, capsys, content):
    (copy / "meta.json").write_bytes(content)
    with pytest.raises(SystemExit) as e:
        sys.exit(cli(["info", str(copy)]))
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and f"{copy}/meta.json" in err, err


def test_cli_flag_mistakes_and_an_output_that_is_a_file_are_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli(["preprocess", "--dataset", "criteo", "--raw", "x", "--out", "y"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    assert "argument --dataset: invalid choice: 'criteo'" in err
    write_kaggle(tmp_path / "raw", 7 * 5, 0, SyntheticSpec(seed=1, vocab_cap=50))
    a_file = tmp_path / "taken"
    a_file.write_text("mine")
    rc = cli(
        ["preprocess", "--dataset", "kaggle", "--raw", str(tmp_path / "raw"), "--out", str(a_file)]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err == (
        f"python -m data_pipeline preprocess: error: --out: {a_file} is a regular file; expected the name of a dataset directory"
    )
    assert a_file.read_text() == "mine"

"""Multi-hot bags materialised from a preprocessed one-hot Criteo directory (multi_hot.py):
the loader's bags against an independent numpy reference of the algorithm, reuse, refusals,
damage, a killed materialisation, two processes at once."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from data_pipeline import multi_hot
from data_pipeline.criteo import CriteoBatchSource, CriteoDataset, PreprocessOptions, preprocess
from data_pipeline.errors import DataError
from data_pipeline.multi_hot import BagSpec, MultiHotDataset, default_directory, materialise
from data_pipeline.synthetic_raw import SyntheticSpec, write_kaggle

SIZES = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    raw = tmp_path_factory.mktemp("raw")
    write_kaggle(raw, 7 * 40 + 3, 25, SyntheticSpec(seed=2, vocab_cap=300))
    out = tmp_path_factory.mktemp("out") / "kaggle"
    # small tables (hashed to 500 rows) so draws collide with real rows
    return preprocess("kaggle", raw, out, PreprocessOptions(max_ind_range=500))


def _mix64(x: int) -> int:
    m = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & m
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
    return x ^ (x >> 31)


def _hash32(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint64) & np.uint64(0xFFFFFFFF)
    x ^= x >> np.uint64(16)
    x = (x * np.uint64(0x7FEB352D)) & np.uint64(0xFFFFFFFF)
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(0x846CA68B)) & np.uint64(0xFFFFFFFF)
    return x ^ (x >> np.uint64(16))


def reference_bags(ids: np.ndarray, n: int, t: int, k: int, dist: str, seed: int) -> np.ndarray:
    """The documented algorithm, written again in plain numpy: column 0 the one-hot id, column
    j a draw keyed by (seed, table, j) and the id; uniform in [0, n), or Lomax(0.25) % n."""
    out = [ids.astype(np.int64)]
    for j in range(1, k):
        x = _mix64(_mix64(_mix64(seed) ^ t) ^ j)
        h1 = _hash32(ids.astype(np.int64) + (x & 0x7FFFFFFF))
        h2 = _hash32(h1.astype(np.int64) + ((x >> 32) & 0x7FFFFFFF))
        u = ((h1 << np.uint64(21)) + (h2 >> np.uint64(11))).astype(np.float64) + 0.5
        u *= 2.0**-53
        if dist == "uniform":
            out.append(np.minimum((u * n).astype(np.int64), n - 1))
        else:
            x = (1.0 - u) ** -4.0 - 1.0
            out.append(np.minimum(x, 2**31 - 1).astype(np.int64) % n)
    return np.stack(out, axis=1)


@pytest.mark.parametrize("dist", ["uniform", "pareto"])
def test_loader_bags_are_the_algorithms_bags(source, dist):
    ds = CriteoDataset(source)
    spec = BagSpec(SIZES, ds.table_sizes, dist, seed=3)
    bags = MultiHotDataset(materialise(source, default_directory(source, spec), spec))
    src = CriteoBatchSource(ds, "train", 64, randomize="total", seed=1, bags=bags, prefetch=0)
    one_hot = CriteoBatchSource(ds, "train", 64, randomize="total", seed=1, prefetch=0)
    for index in (0, 3):
        b, o = src.batch(0, index), one_hot.batch(0, index)
        assert b.labels.equal(o.labels) and b.dense_features.equal(o.dense_features)
        kjt, ids = b.sparse_features, o.sparse_features
        for t, name in enumerate(ds.feature_names):
            got = kjt[name]
            assert got.lengths().tolist() == [SIZES[t]] * len(b.labels)
            want = reference_bags(ids[name].values().numpy(), ds.table_sizes[t], t, SIZES[t],
                                  dist, seed=3)  # fmt: skip
            assert np.array_equal(got.values().numpy().reshape(-1, SIZES[t]), want), name
    made = CriteoBatchSource(ds, "train", 64, randomize="total", seed=1, bags=spec, prefetch=0)
    for index in (1, 3):  # made as loaded (--multi-hot-materialize false): the same bags
        a, b = made.batch(0, index).sparse_features, src.batch(0, index).sparse_features
        assert a.values().equal(b.values()) and a.lengths().equal(b.lengths())
    if dist == "pareto":  # heavy-headed: most draws are the first rows, as the reference's
        extra = reference_bags(np.arange(500), 500, 20, 100, dist, 3)[:, 1:]
        assert np.mean(extra < 10) > 0.4


def test_shards_concatenate_to_the_global_batch(source):
    # unshuffled: a shuffled batch comes sorted by row, per shard
    ds = CriteoDataset(source)
    spec = BagSpec(SIZES, ds.table_sizes)
    bags = MultiHotDataset(materialise(source, default_directory(source, spec), spec))
    whole = CriteoBatchSource(ds, "train", 64, randomize="none", bags=bags, prefetch=0).batch(0, 1)
    parts = [
        CriteoBatchSource(ds, "train", 64, randomize="none", bags=bags, prefetch=0, rank=r,
                          world_size=2).batch(0, 1)
        for r in range(2)
    ]  # fmt: skip
    for name in ds.feature_names:
        joined = np.concatenate([p.sparse_features[name].values().numpy() for p in parts])
        assert np.array_equal(joined, whole.sparse_features[name].values().numpy())


def test_reused_and_refused(source, tmp_path, caplog):
    ds = CriteoDataset(source)
    spec = BagSpec(SIZES, ds.table_sizes)
    out = tmp_path / "bags"
    materialise(source, out, spec)
    stamp = (out / "day_0.values.npy").stat().st_mtime_ns
    caplog.set_level("INFO")
    assert materialise(source, out, spec) == out
    assert (out / "day_0.values.npy").stat().st_mtime_ns == stamp
    assert "reusing multi-hot bags" in caplog.text
    other = BagSpec([2] * 26, ds.table_sizes)
    with pytest.raises(
        DataError, match=r"holds other multi-hot bags \(sizes\[0\]: 3 there, 2 asked"
    ):
        materialise(source, out, other)
    (out / "day_3.values.npy").write_bytes(b"cut")
    with pytest.raises(DataError, match=r"bags: day_3.values.npy: unreadable .* materialise again"):
        materialise(source, out, spec)
    with pytest.raises(DataError, match=r"^--multi-hot-sizes: expected one size >= 1 per"):
        BagSpec([1, 2], ds.table_sizes)
    (tmp_path / "half").mkdir()
    with pytest.raises(DataError, match="exists but is not a complete multi-hot data set"):
        materialise(source, tmp_path / "half", spec)


def test_other_source_data_is_refused(source, tmp_path):
    ds = CriteoDataset(source)
    spec = BagSpec(SIZES, ds.table_sizes)
    out = tmp_path / "bags"
    materialise(source, out, spec)
    meta = (out / "meta.json").read_text()
    record = '"crc32": '
    at = meta.index(record, meta.index('"source"')) + len(record)  # the first part's source CRC
    (out / "meta.json").write_text(meta[:at] + "1" + meta[at:])
    with pytest.raises(DataError, match="was materialised from other one-hot data"):
        materialise(source, out, spec)


def test_damaged_values_file_is_named(source, tmp_path):
    ds = CriteoDataset(source)
    spec = BagSpec(SIZES, ds.table_sizes)
    out = materialise(source, tmp_path / "bags", spec)
    path = out / "day_2.values.npy"
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x40
    path.write_bytes(bytes(data))
    bags = MultiHotDataset(out)
    bags.values("day_0")  # the other parts still load
    with pytest.raises(DataError, match=rf"^{path}: checksum differs .* materialise again$"):
        bags.values("day_2")


def _numpy_bags(self, sparse):
    """BagSpec.bags without numba: forked children must not start numba's thread pool."""
    cols = [reference_bags(sparse[:, t], n, t, k, self.distribution, self.seed)
            for t, (n, k) in enumerate(zip(self.table_sizes, self.sizes))]  # fmt: skip
    return np.concatenate(cols, axis=1).astype(sparse.dtype)


def _killed(source, out):
    """Materialise, and die by SIGKILL once the second part's file is written."""
    multi_hot.BagSpec.bags = _numpy_bags
    finish, done = multi_hot.NpyWriter.finish, []

    def finish_then_die(self):
        done.append(finish(self))
        if len(done) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return done[-1]

    multi_hot.NpyWriter.finish = finish_then_die
    multi_hot.materialise(source, out, multi_hot.BagSpec(SIZES, CriteoDataset(source).table_sizes))


def _one_of_two(source, out, flags: Path, first: bool):
    """The first holds the lock until the second has started; both record what they did."""
    multi_hot.BagSpec.bags = _numpy_bags
    name = "first" if first else "second"
    write, warning = multi_hot._write, multi_hot.log.warning

    def held_write(*args):
        (flags / f"{name}.wrote").touch()
        if first:
            (flags / "holding").touch()
            while not (flags / "second.started").exists():
                time.sleep(0.02)
            time.sleep(0.3)  # the second is at the lock now
        write(*args)

    multi_hot._write = held_write
    multi_hot.log.warning = lambda *a: ((flags / f"{name}.waited").touch(), warning(*a))
    if not first:
        (flags / "second.started").touch()
    multi_hot.materialise(
        source, out, multi_hot.BagSpec(SIZES, CriteoDataset(source).table_sizes), wait_s=0.05
    )


def test_a_killed_materialisation_is_never_taken_and_two_at_once_share_one(source, tmp_path):
    fork = multiprocessing.get_context("fork")  # fast: the modules are imported already
    out, flags = tmp_path / "bags", tmp_path / "flags"
    flags.mkdir()
    killed = fork.Process(target=_killed, args=(source, out))
    killed.start()
    killed.join()
    assert killed.exitcode == -signal.SIGKILL
    assert not out.exists() and len(list(tmp_path.glob(".bags.tmp-*"))) == 1
    with pytest.raises(DataError, match="meta.json: cannot be read"):
        MultiHotDataset(out)
    first = fork.Process(target=_one_of_two, args=(source, out, flags, True))
    first.start()
    while not (flags / "holding").exists() and first.is_alive():
        time.sleep(0.02)
    second = fork.Process(target=_one_of_two, args=(source, out, flags, False))
    second.start()
    first.join()
    second.join()
    assert first.exitcode == 0 and second.exitcode == 0
    # the second waited for the lock, then reused the first one's bags without writing any
    assert (flags / "second.waited").exists() and not (flags / "second.wrote").exists()
    assert not list(tmp_path.glob(".bags.tmp-*"))  # the killed one's leftover is gone
    table_sizes = CriteoDataset(source).table_sizes
    clean = materialise(source, tmp_path / "clean", BagSpec(SIZES, table_sizes))
    for part in ("day_0", "day_6"):
        assert np.array_equal(
            MultiHotDataset(out).values(part), MultiHotDataset(clean).values(part)
        )


def test_cli_materialises_where_training_looks(source, capsys):
    from data_pipeline.__main__ import main as cli

    assert cli(["multi-hot", str(source), "--sizes", "2", "--distribution", "pareto"]) == 0
    out = Path(json.loads(capsys.readouterr().out)["out"])
    spec = BagSpec([2] * 26, CriteoDataset(source).table_sizes, "pareto")
    assert (
        out == default_directory(source, spec) and MultiHotDataset(out).sizes.tolist() == [2] * 26
    )
    assert cli(["multi-hot", str(source), "--sizes", "2-x"]) == 2
    assert (
        capsys.readouterr().err.strip()
        == "python -m data_pipeline multi-hot: error: --sizes: expected whole numbers like 3-2-1, got '2-x'"
    )
    assert cli(["multi-hot", str(source), "--sizes", "2-3"]) == 2
    assert (
        "multi-hot: error: --sizes: expected one size >= 1 per categorical feature (26), got 2"
        in (capsys.readouterr().err)
    )


def test_bags_where_the_lock_cannot_be_made_are_one_line_not_a_wait(source, tmp_path, monkeypatch):
    """Beside a preprocessed directory on a read-only file system, the old code took the lock
    file's EROFS for another process materialising and waited forever (issue 46)."""
    import errno

    from hybrid_dlrm.common import lock

    real = os.open

    def read_only(path, flags, *a):
        if str(path).endswith(".lock"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real(path, flags, *a)

    def sleep(s):
        raise AssertionError(f"waited ({s} s)")

    monkeypatch.setattr(lock.os, "open", read_only)
    monkeypatch.setattr(time, "sleep", sleep)
    spec = BagSpec(SIZES, CriteoDataset(source).table_sizes)
    out = tmp_path / "bags"
    with pytest.raises(DataError) as e:
        materialise(source, out, spec)
    assert str(e.value) == (
        f"--multi-hot-sizes: {tmp_path / '.bags.lock'}: cannot make the lock file (Read-only "
        "file system); choose a place this process can write (where the multi-hot bags go); "
        f"materialise them in a writable place (python -m data_pipeline multi-hot {source} "
        "--out DIR) or make them per batch (--multi-hot-materialize false)"
    )
    assert not out.exists() and not list(tmp_path.glob(".bags.tmp-*"))


def test_bags_whose_lock_outlived_its_taker_are_one_line_not_a_wait(source, tmp_path, monkeypatch):
    import fcntl

    def sleep(s):
        raise AssertionError(f"waited ({s} s)")

    path = tmp_path / ".bags.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a child that inherited it holds it
    os.pwrite(fd, b"1073741824\n", 0)  # a process that cannot exist (above any pid_max)
    monkeypatch.setattr(time, "sleep", sleep)
    try:
        with pytest.raises(DataError, match=f"{path} is held, but process 1073741824 that took"):
            materialise(
                source, tmp_path / "bags", BagSpec(SIZES, CriteoDataset(source).table_sizes)
            )
    finally:
        os.close(fd)


def test_bag_sizes_past_the_memory_are_one_line_before_anything_is_made(
    source, tmp_path, monkeypatch, capsys
):
    """Issue 46: `multi-hot --sizes 1000000` spent minutes making its spec, then died in a 2.7
    TiB allocation. The sizes are counted against the memory first (a small machine here)."""
    from data_pipeline import bag_memory
    from data_pipeline.__main__ import main
    from hybrid_dlrm.common.host_memory import Room

    monkeypatch.setattr(bag_memory, "host_room", lambda limit=None: Room(64 << 20, "MemAvailable"))
    out = tmp_path / "bags"
    assert main(["multi-hot", str(source), "--sizes", "100", "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        "python -m data_pipeline multi-hot: error: --sizes: bags of 2,600 ids per sample need 1.3 GiB for materialising the bags "
        "(65,536 samples) but this process may use 64.0 MiB (MemAvailable); use smaller bags\n"
    )
    assert not out.exists() and not list(tmp_path.glob(".bags*"))
    with pytest.raises(DataError, match=r"^--multi-hot-sizes: bags of 2,600 ids per sample"):
        materialise(source, out, BagSpec([100] * 26, CriteoDataset(source).table_sizes))


def test_the_default_directory_goes_through_the_output_rule(source, tmp_path):
    """Issue 46: the directory materialise writes where no --out names it (beside the
    preprocessed one) is refused as every output is: a symbolic link there is never written
    through, a file there is never replaced."""
    src = source
    spec = BagSpec(SIZES, CriteoDataset(src).table_sizes, seed=99)  # a directory no other test uses
    out = default_directory(src, spec)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out.symlink_to(elsewhere)
    with pytest.raises(DataError, match="is a symbolic link, which is never written through"):
        materialise(src, out, spec)
    assert list(elsewhere.iterdir()) == []
    out.unlink()
    out.write_text("mine")
    with pytest.raises(DataError, match="is a regular file; expected the name of a multi-hot"):
        materialise(src, out, spec)
    assert out.read_text() == "mine"
    out.unlink()

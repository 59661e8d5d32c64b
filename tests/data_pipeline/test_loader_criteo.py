"""CriteoBatchSource: contents, order, replay, sharding, epochs, and the permutation it uses."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from data_pipeline.criteo import CriteoBatchSource, CriteoDataset, PreprocessOptions, preprocess
from data_pipeline.errors import DataError
from data_pipeline.permutation import FeistelPermutation
from data_pipeline.source import BatchSource
from data_pipeline.synthetic_raw import SyntheticSpec, write_kaggle


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    raw = tmp_path_factory.mktemp("raw")
    write_kaggle(raw, 7 * 151 + 3, 25, SyntheticSpec(seed=2, vocab_cap=500))
    out = tmp_path_factory.mktemp("out")
    return preprocess(
        "kaggle", raw, out, PreprocessOptions(max_ind_range=10**9, test_raw=raw / "test.txt")
    )


def _all(ds: CriteoDataset, split: str):
    """The split's rows, concatenated in file order."""
    labels, dense, sparse = [], [], []
    for part, start, stop in ds.segments(split):
        lab, den, spa = ds.columns(part)
        labels.append(np.full(stop - start, np.nan) if lab is None else lab[start:stop])
        dense.append(den[start:stop])
        sparse.append(spa[start:stop])
    return np.concatenate(labels), np.concatenate(dense), np.concatenate(sparse)


def _rows_of_epoch(src: CriteoBatchSource, epoch: int) -> list[np.ndarray]:
    return [src.rows(epoch, i) for i in range(len(src))]


def test_batches_hold_the_rows_they_say(data_dir) -> None:
    src = CriteoBatchSource(data_dir, "train", 100, randomize="total", seed=3)
    typed: BatchSource = src  # the protocol is not runtime-checkable: check its members
    for member in ("batch_size", "num_dense", "table_sizes", "feature_names", "batches", "__len__"):
        assert hasattr(typed, member)
    assert src.num_dense == 13 and len(src.table_sizes) == 26 and src.feature_names[25] == "cat_25"
    labels, dense, sparse = _all(src.dataset, "train")
    for i, batch in enumerate(src.batches(epoch=1)):
        rows = src.rows(1, i)
        np.testing.assert_array_equal(batch.labels.numpy(), labels[rows].astype(np.float32))
        np.testing.assert_array_equal(batch.dense_features.numpy(), dense[rows])
        kjt = batch.sparse_features
        assert kjt.keys() == src.feature_names
        assert kjt.values().dtype == torch.int64 and (kjt.lengths() == 1).all()
        # key-major: all of cat_0 for the batch, then cat_1, ...
        np.testing.assert_array_equal(kjt.values().numpy().reshape(26, -1), sparse[rows].T)
        assert batch.dense_features.dtype == torch.float32 and batch.labels.dtype == torch.float32
    assert i == len(src) - 1


@pytest.mark.parametrize("randomize", ["none", "day", "total"])
def test_each_epoch_covers_every_row_once(data_dir, randomize) -> None:
    src = CriteoBatchSource(data_dir, "train", 64, randomize=randomize, seed=5)
    n = src.num_samples
    assert n == 3 * 152 + 3 * 151 and len(src) == -(-n // 64)  # days 0-5 of 1060 lines
    epoch0 = _rows_of_epoch(src, 0)
    assert sorted(np.concatenate(epoch0).tolist()) == list(range(n))
    assert [len(r) for r in epoch0] == [64] * (len(src) - 1) + [n - 64 * (len(src) - 1)]
    epoch1 = _rows_of_epoch(src, 1)
    if randomize == "none":
        np.testing.assert_array_equal(np.concatenate(epoch0), np.arange(n))
        assert all((a == b).all() for a, b in zip(epoch0, epoch1))
    else:
        assert any((a != b).any() for a, b in zip(epoch0, epoch1))  # reshuffled each epoch

    def day(x):
        return np.searchsorted(src._seg_starts, x, side="right") - 1

    if randomize == "day":  # rows stay in the day of their positions: days in order
        for i, rows in enumerate(epoch0):
            positions = np.arange(i * 64, i * 64 + len(rows))
            assert (
                np.bincount(day(rows), minlength=6).tolist()
                == np.bincount(day(positions), minlength=6).tolist()
            )
    if randomize == "total":  # batches mix days
        assert max(len(np.unique(day(rows))) for rows in epoch0) >= 3


def test_order_is_seeded_and_replayable(data_dir) -> None:
    a = CriteoBatchSource(data_dir, "train", 50, randomize="total", seed=1)
    b = CriteoBatchSource(data_dir, "train", 50, randomize="total", seed=1, prefetch=0)
    c = CriteoBatchSource(data_dir, "train", 50, randomize="total", seed=2)
    full = [x.labels for x in a.batches(epoch=2)]
    again = [x.labels for x in b.batches(epoch=2)]
    assert all(torch.equal(x, y) for x, y in zip(full, again))
    resumed = list(a.batches(epoch=2, start=7))
    assert len(resumed) == len(a) - 7
    for x, y in zip(resumed, list(a.batches(epoch=2))[7:]):
        assert torch.equal(x.dense_features, y.dense_features)
        assert torch.equal(x.sparse_features.values(), y.sparse_features.values())
    assert any((x != y).any() for x, y in zip(_rows_of_epoch(a, 0), _rows_of_epoch(c, 0)))
    # a consumer that stops early leaves no thread behind
    it = a.batches(epoch=0)
    next(it)
    it.close()


@pytest.mark.parametrize("randomize", ["none", "total"])
def test_shards_partition_each_global_batch(data_dir, randomize) -> None:
    whole = CriteoBatchSource(data_dir, "train", 48, randomize=randomize, seed=9)
    shards = [
        CriteoBatchSource(data_dir, "train", 48, randomize=randomize, seed=9, rank=r, world_size=3)
        for r in range(3)
    ]
    assert all(len(s) == len(whole) for s in shards)
    for i in range(len(whole)):
        parts = [s.rows(0, i) for s in shards]
        if i < len(whole) - 1:
            assert [len(p) for p in parts] == [16, 16, 16]
        assert sorted(np.concatenate(parts).tolist()) == sorted(whole.rows(0, i).tolist())
    batch = next(iter(shards[1].batches()))
    assert batch.dense_features.shape == (16, 13) and batch.sparse_features.values().shape == (
        16 * 26,
    )


def test_drop_last_splits_and_inference(data_dir) -> None:
    src = CriteoBatchSource(data_dir, "train", 100, drop_last=True)
    assert len(src) == src.num_samples // 100
    assert all(len(b.labels) == 100 for b in src.batches())
    test = CriteoBatchSource(data_dir, "test", 1000)
    val = CriteoBatchSource(data_dir, "val", 1000)
    assert (test.num_samples, val.num_samples) == (76, 75)  # day 6 has 151 rows: test = ceil
    t = next(iter(test.batches())).dense_features
    v = next(iter(val.batches())).dense_features
    _, day6, _ = test.dataset.columns("day_6")
    np.testing.assert_array_equal(torch.cat([t, v]).numpy(), day6)
    inference = CriteoBatchSource(data_dir, "inference", 10, index_dtype=torch.int32)
    batch = next(iter(inference.batches()))
    assert torch.isnan(batch.labels).all() and batch.sparse_features.values().dtype == torch.int32


def test_bad_arguments(data_dir, tmp_path) -> None:
    with pytest.raises(DataError, match="no split 'holdout'"):
        CriteoBatchSource(data_dir, "holdout", 10)
    with pytest.raises(DataError, match="multiple of the world size"):
        CriteoBatchSource(data_dir, "train", 10, world_size=3)
    with pytest.raises(DataError, match="--data-randomize"):
        CriteoBatchSource(data_dir, "train", 10, randomize="shuffle")
    with pytest.raises(DataError, match="meta.json: not found"):
        CriteoBatchSource(tmp_path, "train", 10)
    with pytest.raises(IndexError):
        next(CriteoBatchSource(data_dir, "train", 10).batches(start=10**6))


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 7, 8, 9, 100, 1023, 1024, 1025, 99991])
def test_feistel_is_a_permutation(n) -> None:
    perm = FeistelPermutation(n, key=12345)
    out = perm(np.arange(n))
    assert sorted(out.tolist()) == list(range(n))
    np.testing.assert_array_equal(perm(np.arange(n)[::-1]), out[::-1])  # position-addressable
    if n > 100:
        assert not np.array_equal(out, np.arange(n))
        assert not np.array_equal(out, FeistelPermutation(n, key=54321)(np.arange(n)))


def test_feistel_reaches_every_small_permutation() -> None:
    seen = {tuple(FeistelPermutation(4, key)(np.arange(4))) for key in range(600)}
    assert len(seen) == 24  # all orders of 4 items occur: no structural bias for small days

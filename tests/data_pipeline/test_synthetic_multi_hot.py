"""Synthetic multi-hot bags: sizes, determinism, replay, sharding, and the bag kernel's one-hot
case equal to the one-hot kernel (so one-hot data is unchanged by the bag path)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from data_pipeline.synthetic import PlantedWorld, SyntheticBatchSource, SyntheticConfig

TABLES = [1000, 50, 3, 200_000]
SIZES = [3, 1, 2, 20]


def _world(seed=5, sizes=SIZES):
    return PlantedWorld(SyntheticConfig(table_sizes=TABLES, seed=seed, multi_hot_sizes=sizes))


def _equal(a, b):
    ka, kb = a.sparse_features, b.sparse_features
    return (
        torch.equal(a.dense_features, b.dense_features)
        and torch.equal(a.labels, b.labels)
        and torch.equal(ka.values(), kb.values())
        and torch.equal(ka.lengths(), kb.lengths())
    )


def test_bags_have_the_sizes_asked_for():
    b = SyntheticBatchSource(_world(), "train", 100, 2).batch(0, 1)
    kjt = b.sparse_features
    assert kjt.keys() == ["cat_0", "cat_1", "cat_2", "cat_3"] and kjt.stride() == 100
    for key, n, k in zip(kjt.keys(), TABLES, SIZES):
        jt = kjt[key]
        assert jt.lengths().tolist() == [k] * 100
        assert jt.values().min() >= 0 and jt.values().max() < n
    # the ids in a bag are independent draws: the 20-id bags are not all one id
    bags = kjt["cat_3"].values().reshape(100, 20)
    assert (bags != bags[:, :1]).any(dim=1).float().mean() > 0.5


def test_deterministic_per_seed_and_replayable_from_any_step():
    batch = 3000  # batches straddle the 8192-sample chunks
    full = list(SyntheticBatchSource(_world(), "train", batch, 6).batches(epoch=1))
    again = SyntheticBatchSource(_world(), "train", batch, 6)
    assert all(_equal(x, y) for x, y in zip(full[3:], again.batches(epoch=1, start=3)))
    other = SyntheticBatchSource(_world(seed=6), "train", batch, 6).batch(1, 0)
    assert not torch.equal(other.sparse_features.values(), full[0].sparse_features.values())


@pytest.mark.parametrize("world_size", [2, 4])
def test_shards_concatenate_to_the_one_process_batch(world_size):
    whole = SyntheticBatchSource(_world(), "train", 4000, 3).batch(0, 2)
    shards = [
        SyntheticBatchSource(_world(), "train", 4000, 3, r, world_size).batch(0, 2)
        for r in range(world_size)
    ]
    assert torch.equal(torch.cat([s.labels for s in shards]), whole.labels)
    for key in whole.sparse_features.keys():
        joined = torch.cat([s.sparse_features[key].values() for s in shards])
        assert torch.equal(joined, whole.sparse_features[key].values())


def test_bag_kernel_with_one_id_per_bag_is_the_one_hot_kernel():
    one_hot = _world(sizes=None)
    for index in (0, 7):
        a, b = one_hot.chunk("test", index), one_hot.chunk("test", index, kernel="bags")
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    # and the one-hot world's batches are the one-id-per-feature layout as before
    kjt = SyntheticBatchSource(one_hot, "train", 10, 1).batch(0, 0).sparse_features
    assert torch.all(kjt.lengths() == 1)


def test_base_rate_stays_near_one_hot_with_mlperf_sized_bags():
    """The planted model reads each bag's mean row: long Zipf bags of repeated hot rows must
    not push the click rate towards 0 or 1 (summed, MLPerf's sizes gave 0.7)."""
    sizes = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]
    tables = [max(2, n // 100) for n in [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3,
              93145, 5683, 8351593, 3194, 27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15,
              286181, 105, 142572]]  # fmt: skip
    rates = [
        PlantedWorld(SyntheticConfig(table_sizes=tables, multi_hot_sizes=s)).chunk("train", 0)[2]
        for s in (None, sizes)
    ]
    one_hot, multi_hot = (float(r.mean()) for r in rates)
    assert 0.15 < multi_hot < 0.45 and abs(multi_hot - one_hot) < 0.1


def test_config_rejects_a_wrong_count():
    with pytest.raises(ValueError, match="one bag size >= 1 per table"):
        SyntheticConfig(table_sizes=TABLES, multi_hot_sizes=[1, 2])
    assert np.array_equal(_world().bag_sizes, SIZES)

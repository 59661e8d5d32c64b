import numpy as np
import pytest
import torch

from data_pipeline import synthetic as S
from data_pipeline.synthetic import PlantedWorld, SyntheticBatchSource, SyntheticConfig


@pytest.fixture(scope="module")
def world():
    return PlantedWorld(SyntheticConfig(table_sizes=[1000, 50, 3, 200_000], seed=5))


def batches_equal(a, b):
    return (
        torch.equal(a.dense_features, b.dense_features)
        and torch.equal(a.labels, b.labels)
        and torch.equal(a.sparse_features.values(), b.sparse_features.values())
        and torch.equal(a.sparse_features.lengths(), b.sparse_features.lengths())
    )


def test_batch_layout(world):
    src = SyntheticBatchSource(world, "train", 100, 3)
    b = next(src.batches())
    assert b.dense_features.shape == (100, 13) and b.dense_features.dtype == torch.float32
    assert b.labels.shape == (100,) and set(b.labels.unique().tolist()) <= {0.0, 1.0}
    kjt = b.sparse_features
    assert kjt.keys() == ["cat_0", "cat_1", "cat_2", "cat_3"]
    assert torch.all(kjt.lengths() == 1) and kjt.values().dtype == torch.int64
    for key, n in zip(kjt.keys(), [1000, 50, 3, 200_000]):
        v = kjt[key].values()
        assert v.min() >= 0 and v.max() < n
    assert torch.all(b.dense_features >= 0)


def test_replay_from_any_position_and_across_chunks(world):
    batch = 3000  # batches straddle the 8192-sample chunks
    src = SyntheticBatchSource(world, "train", batch, 8)
    full = list(src.batches(epoch=1))
    again = list(SyntheticBatchSource(world, "train", batch, 8).batches(epoch=1, start=5))
    assert len(again) == 3
    for a, b in zip(full[5:], again):
        assert batches_equal(a, b)
    # the stream is the same whatever the batch size: 2 batches of 1500 == 1 batch of 3000
    small = list(SyntheticBatchSource(world, "train", 1500, 16).batches(epoch=0))
    big = list(SyntheticBatchSource(world, "train", 3000, 8).batches(epoch=0))
    assert torch.equal(torch.cat([small[0].labels, small[1].labels]), big[0].labels)


def test_batch_is_the_same_face_as_every_source(world):
    """batch(epoch, index) is batches(epoch, index)'s first batch, as for Criteo and Taobao."""
    src = SyntheticBatchSource(world, "train", 700, 4)
    for epoch in (0, 2):
        assert batches_equal(src.batch(epoch, 3), next(src.batches(epoch, start=3)))
    with pytest.raises(IndexError, match="batch 4 of 4"):
        src.batch(0, 4)
    with pytest.raises(IndexError, match="start batch 5 of 4"):
        next(src.batches(0, start=5))


def test_splits_epochs_and_shards_differ(world):
    tr = next(SyntheticBatchSource(world, "train", 500, 2).batches(0))
    te = next(SyntheticBatchSource(world, "test", 500, 2).batches(0))
    ep1 = next(SyntheticBatchSource(world, "train", 500, 2).batches(1))
    for a, b in [(tr, te), (tr, ep1)]:
        assert not torch.equal(a.dense_features[:250], b.dense_features[:250])


def test_rank_shards_are_contiguous_slices_of_the_global_batch(world):
    """W processes train on exactly the samples one process would: rank r's shard of global
    batch i is its r-th contiguous slice (batches crossing a chunk boundary included)."""
    whole = SyntheticBatchSource(world, "train", 6000, 3)
    shards = [SyntheticBatchSource(world, "train", 6000, 3, rank=r, world_size=3) for r in range(3)]
    for i in range(3):  # batch 1 crosses the 8192-sample chunk boundary
        w = whole.batch(1, i)
        for r, src in enumerate(shards):
            s = src.batch(1, i)
            part = slice(r * 2000, (r + 1) * 2000)
            assert s.labels.numel() == 2000
            assert torch.equal(s.dense_features, w.dense_features[part])
            assert torch.equal(s.labels, w.labels[part])
            ids = s.sparse_features.to_dict()
            for key, jt in w.sparse_features.to_dict().items():
                assert torch.equal(ids[key].values(), jt.values()[part])


def test_same_seed_same_world_other_seed_other_data():
    cfg = dict(table_sizes=[100, 100])
    a = PlantedWorld(SyntheticConfig(**cfg, seed=1)).chunk("train", 0)
    b = PlantedWorld(SyntheticConfig(**cfg, seed=1)).chunk("train", 0)
    c = PlantedWorld(SyntheticConfig(**cfg, seed=2)).chunk("train", 0)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0])


@pytest.mark.parametrize("alpha", [0.0, 1.05, 1.5])
def test_zipf_frequencies_follow_the_power_law(alpha):
    n = 1000
    world = PlantedWorld(SyntheticConfig(table_sizes=[n], zipf_alpha=alpha, seed=0))
    rows = torch.cat([world.chunk("train", k)[0][0] for k in range(25)]).numpy()
    counts = np.bincount(rows, minlength=n) / len(rows)
    # continuous power law on [1, n+1): P(rank r) = integral over [r, r+1)
    edges = np.arange(1, n + 2, dtype=np.float64)
    if alpha == 0:
        cdf = edges - 1
    else:
        cdf = (edges ** (1 - alpha) - 1) / (1 - alpha)
    expected = np.diff(cdf) / cdf[-1]
    assert np.abs(counts[:20] - expected[:20]).max() < 0.01
    assert abs(counts[:100].sum() - expected[:100].sum()) < 0.01


def test_labels_carry_the_planted_signal(world):
    """Row effects are learnable: the empirical CTR of the hottest rows spreads out."""
    rows, dense, labels = world.chunk("train", 0)
    big = PlantedWorld(SyntheticConfig(table_sizes=[20], seed=3, row_effect=2.0, num_pairs=0))
    chunks = [big.chunk("train", k) for k in range(10)]
    r = torch.cat([c[0] for c in chunks], dim=1)
    y = torch.cat([c[2] for c in chunks])
    ctr = torch.stack([y[r[0] == i].mean() for i in range(5)])
    assert ctr.max() - ctr.min() > 0.1
    assert 0.1 < labels.mean().item() < 0.5


def test_bad_config():
    with pytest.raises(ValueError, match="at least one row"):
        SyntheticConfig(table_sizes=[10, 0])
    with pytest.raises(ValueError, match="one non-negative Zipf exponent per table"):
        SyntheticConfig(table_sizes=[10, 10], zipf_alpha=[1.0])
    with pytest.raises(ValueError, match="unknown split"):
        SyntheticBatchSource(PlantedWorld(SyntheticConfig(table_sizes=[5])), "dev", 10, 1)


def test_scaled_kaggle_sizes():
    assert len(S.KAGGLE_TABLE_SIZES) == 26 and sum(S.KAGGLE_TABLE_SIZES) == 33_762_577
    small = S.scaled_table_sizes(0.001)
    assert min(small) == 2 and small[2] == 10131

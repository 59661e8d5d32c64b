"""The parallel SGD update (embeddings/cpu_tbe.py) is fbgemm's CPU update, bit for bit."""

from __future__ import annotations

import pytest
import torch

from embeddings import cpu_tbe
from embeddings.config import TableSpec
from embeddings.fused import FusedEmbeddingBagCollection
from embeddings.optimizer import SparseOptimizer

SIZES, DIMS = [1000, 3, 50_000, 77], [16, 16, 8, 32]
TABLES = [TableSpec(f"t{i}", n, d, f"c{i}") for i, (n, d) in enumerate(zip(SIZES, DIMS))]


def _bags(gen, batch: int, most: int, narrow: int, dtype):
    """Table-major bags of 0..`most` ids (empty ones too), ids squeezed into the first
    1/`narrow` of each table so that rows repeat within and across bags."""
    lengths = torch.randint(0, most + 1, (len(SIZES) * batch,), generator=gen)
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.long)
    offsets[1:] = lengths.cumsum(0)
    ids = [
        torch.randint(0, max(1, n // narrow), (int(lengths[t * batch : (t + 1) * batch].sum()),),
                      generator=gen)
        for t, n in enumerate(SIZES)
    ]  # fmt: skip
    return torch.cat(ids).to(dtype), offsets.to(dtype)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("most", [1, 4])  # one-hot (Kaggle) and multi-hot bags
def test_lookups_and_updates_equal_fbgemms_own_bit_for_bit(dtype, most):
    opt = SparseOptimizer("sgd", 0.05)
    theirs = FusedEmbeddingBagCollection(TABLES, opt, backend="fbgemm", seed=3)
    ours = FusedEmbeddingBagCollection(TABLES, opt, backend="fbgemm", seed=3)
    assert isinstance(ours._lookup, cpu_tbe.ParallelUpdateLookup)
    gen = torch.Generator().manual_seed(0)
    for step in range(12):
        if step == 6:  # a schedule's new rate reaches the update
            theirs.set_learning_rate(0.2)
            ours.set_learning_rate(0.2)
        ids, offsets = _bags(gen, 64, most, 1 + (step % 3) * 20, dtype)
        a, b = theirs._impl(ids, offsets), ours.pooled(ids, offsets)
        assert torch.equal(a, b)
        grad = torch.randn(a.shape, generator=gen)
        a.backward(grad)
        b.backward(grad)
        for x, y in zip(theirs.table_weights(), ours.table_weights()):
            assert torch.equal(x, y), step
    assert not torch.equal(theirs.table_weights()[0], _fresh().table_weights()[0])  # it trained


def _fresh():
    return FusedEmbeddingBagCollection(TABLES, SparseOptimizer("sgd", 0.05), seed=3)


def test_only_sgd_on_cpu_takes_the_parallel_update():
    for kind in ("adagrad", "rowwise_adagrad"):  # their state: fbgemm's own update
        c = FusedEmbeddingBagCollection(TABLES, SparseOptimizer(kind, 0.05), backend="fbgemm")
        assert c._lookup is c._impl
    torch_path = FusedEmbeddingBagCollection(TABLES, SparseOptimizer("sgd"), backend="torch")
    assert torch_path._lookup is torch_path._impl
    assert not cpu_tbe.applies(SparseOptimizer("sgd"), torch.device("cuda"))


def test_an_id_out_of_range_is_refused_before_anything_is_written():
    c = _fresh()
    before = [w.clone() for w in c.table_weights()]
    ids = torch.tensor([5, 1, 7, 77])  # table 3 has 77 rows
    offsets = torch.arange(5)
    with pytest.raises(RuntimeError, match="out of bounds"):  # fbgemm's forward says so first
        c.pooled(ids, offsets)
    grad = torch.ones(1, sum(DIMS))
    with pytest.raises(IndexError, match="id out of range in table 3"):  # the update checks too
        c._lookup.update(ids, offsets, grad)
    assert torch.equal(c.table_weights()[3], before[3])

"""Row-wise quantized tables: the stored layout, its error bound, and fbgemm's integer table-batched
embedding against the pure-PyTorch dequantising path."""

import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embeddings._fbgemm import fbgemm_available
from embeddings.collection import EmbeddingCollection, EmbeddingLookup
from embeddings.config import tables_for_features
from embeddings.quantized import (
    BITS,
    QuantizedEmbeddingBagCollection,
    dequantize_rows,
    quantize_rows,
    row_bytes,
)

PRECISIONS = ["fp32", "fp16", "int8", "int4", "int2"]


def _kjt(sizes, batch, gen, max_len=3, dtype=torch.int64):
    lengths = torch.randint(0, max_len + 1, (len(sizes) * batch,), generator=gen)
    values = torch.cat([
        torch.randint(0, n, (int(lengths[t * batch : (t + 1) * batch].sum()),), generator=gen)
        for t, n in enumerate(sizes)
    ])  # fmt: skip
    names = [f"cat_{i}" for i in range(len(sizes))]
    return KeyedJaggedTensor(keys=names, values=values.to(dtype), lengths=lengths.to(torch.int32))


def _reference(weights, kjt):
    """Sum pooling of float tables, bag by bag."""
    out = []
    for name, w in zip(kjt.keys(), weights):
        jt = kjt[name]
        bags = [w[jt.values()[a:b]].sum(0) for a, b in zip(jt.offsets()[:-1], jt.offsets()[1:])]
        out.append(torch.stack(bags))
    return torch.cat(out, dim=1)


def test_row_bytes_are_what_the_targets_count():
    # int8: 4 bytes of float16 scale and bias per row, then one byte per value
    assert row_bytes(16, "int8") / row_bytes(16, "fp32") == 20 / 64  # 31.25% <= 32%
    assert row_bytes(64, "int8") / row_bytes(64, "fp32") == 68 / 256  # 26.6% <= 27%
    assert row_bytes(16, "int4") / row_bytes(16, "fp32") == 12 / 64  # 18.75% <= 19%
    assert [row_bytes(16, p) for p in PRECISIONS] == [64, 32, 20, 12, 8]
    w = torch.randn(10, 16)
    assert [quantize_rows(w, p).shape for p in PRECISIONS] == [(10, b) for b in (64, 32, 20, 12, 8)]


@pytest.mark.parametrize("precision", ["int8", "int4", "int2"])
def test_dequantized_values_are_within_half_a_step(precision):
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(500, 16, generator=gen) * torch.rand(500, 1, generator=gen)
    w[0] = 0.25  # a constant row: scale 0 becomes 1, every code 0, exact
    q = quantize_rows(w, precision)
    scale = q[:, :4].contiguous().view(torch.float16).float()[:, 0]
    back = dequantize_rows(q, precision, 16)
    assert torch.equal(back[0], w[0])
    err = (back - w).abs().amax(dim=1)
    assert (err[1:] <= scale[1:] / 2 * (1 + 1e-3) + 1e-7).all()
    levels = (1 << BITS[precision]) - 1
    assert (scale[1:] <= (w.amax(1) - w.amin(1))[1:] / levels * 1.002 + 1e-6).all()


def test_fp_precisions_round_trip_and_range_is_checked():
    w = torch.randn(7, 8)
    assert torch.equal(dequantize_rows(quantize_rows(w, "fp32"), "fp32", 8), w)
    assert torch.equal(dequantize_rows(quantize_rows(w, "fp16"), "fp16", 8), w.half().float())
    with pytest.raises(ValueError, match="float16 range"):
        quantize_rows(torch.full((2, 8), 1e6), "int8")
    with pytest.raises(ValueError, match="int2 needs a dimension divisible by 4"):
        quantize_rows(torch.randn(2, 6), "int2")
    with pytest.raises(ValueError, match="unknown precision 'int3'"):
        quantize_rows(torch.randn(2, 8), "int3")


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_fbgemm_and_torch_paths_give_the_same_pooled_outputs(index_dtype):
    if not fbgemm_available():
        pytest.skip("fbgemm is not installed")
    gen = torch.Generator().manual_seed(0)
    sizes, dim = [50, 300, 7, 1000, 20, 33], 16
    tables = tables_for_features(sizes, dim)
    weights = [torch.randn(n, dim, generator=gen) * 0.1 for n in sizes]
    precisions = PRECISIONS + ["int4"]
    rows = [quantize_rows(w, p) for w, p in zip(weights, precisions)]
    kjt = _kjt(sizes, 64, gen, dtype=index_dtype)  # bags of 0 to 3 ids, empty ones included
    fb = QuantizedEmbeddingBagCollection(tables, precisions, rows, backend="fbgemm")
    pt = QuantizedEmbeddingBagCollection(tables, precisions, rows, backend="torch")
    a, b = fb(kjt), pt(kjt)
    assert a.keys() == b.keys() == [t.feature_name for t in tables]
    torch.testing.assert_close(a.values(), b.values(), rtol=1e-6, atol=1e-6)
    # and both are sum pooling of the dequantised tables
    deq = [dequantize_rows(r, p, dim) for r, p in zip(rows, precisions)]
    torch.testing.assert_close(b.values(), _reference(deq, kjt), rtol=1e-5, atol=1e-6)
    assert [torch.equal(x, y) for x, y in zip(pt.table_weights(), deq)] == [True] * len(deq)


def test_collection_is_inference_only_and_checks_its_rows():
    tables = tables_for_features([5, 6], 8)
    rows = [quantize_rows(torch.randn(5, 8), "int8"), quantize_rows(torch.randn(6, 8), "int4")]
    coll = QuantizedEmbeddingBagCollection(tables, ["int8", "int4"], rows, backend="torch")
    # the lookup contract only: nothing to train, so nothing that raises when asked to
    assert isinstance(coll, EmbeddingLookup) and not isinstance(coll, EmbeddingCollection)
    assert not hasattr(coll, "set_learning_rate") and not hasattr(coll, "optimizer_states")
    with pytest.raises(
        ValueError, match=r"table t_cat_1: rows torch.uint8 \(6, 8\), expected uint8 \(6, 12\)"
    ):
        QuantizedEmbeddingBagCollection(tables, ["int8", "int8"], rows, backend="torch")
    state = coll.state_dict()  # the contract's full tables, dequantised
    assert torch.equal(state["t_cat_1.weight"], dequantize_rows(rows[1], "int4", 8))
    with pytest.raises(RuntimeError, match="built from its rows"):
        coll.load_state_dict(state)


@pytest.mark.gpu
def test_torch_path_on_cuda_matches_cpu():
    gen = torch.Generator().manual_seed(3)
    sizes, dim = [40, 9, 300], 8
    tables = tables_for_features(sizes, dim)
    rows = [quantize_rows(torch.randn(n, dim, generator=gen), p)
            for n, p in zip(sizes, ["int8", "int4", "fp16"])]  # fmt: skip
    kjt = _kjt(sizes, 32, gen)
    cpu = QuantizedEmbeddingBagCollection(tables, ["int8", "int4", "fp16"], rows, backend="torch")
    gpu = QuantizedEmbeddingBagCollection(
        tables, ["int8", "int4", "fp16"], rows, device="cuda", backend="torch"
    )
    torch.testing.assert_close(gpu(kjt.to("cuda")).values().cpu(), cpu(kjt).values())

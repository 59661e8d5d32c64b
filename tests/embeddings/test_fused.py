import pytest
import torch
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embeddings import FusedEmbeddingBagCollection, SparseOptimizer, TableSpec, _fbgemm
from embeddings.optimizer import SPARSE_OPTIMIZERS

SIZES = [50, 7, 300, 1]


def tables(dims=(8, 8, 8, 8)):
    return [TableSpec(f"t{i}", n, d, f"f{i}") for i, (n, d) in enumerate(zip(SIZES, dims))]


def random_kjt(
    gen: torch.Generator, batch: int, sizes=SIZES, max_len: int = 4
) -> KeyedJaggedTensor:
    lengths = torch.randint(0, max_len, (len(sizes) * batch,), generator=gen)
    values = torch.cat(
        [torch.randint(0, n, (int(length),), generator=gen) for i, n in enumerate(sizes)
         for length in lengths[i * batch:(i + 1) * batch].tolist()]
    )  # fmt: skip
    return KeyedJaggedTensor([f"f{i}" for i in range(len(sizes))], values, lengths=lengths)


def train_steps(coll, steps=4, batch=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    outs = []
    for _ in range(steps):
        kjt = random_kjt(gen, batch)
        out = coll(kjt).values()
        grad = torch.randn(out.shape, generator=gen)
        (out * grad).sum().backward()
        outs.append(out.detach().clone())
    return outs


@pytest.mark.parametrize("kind", SPARSE_OPTIMIZERS)
def test_fbgemm_and_torch_paths_agree(kind):
    opt = SparseOptimizer(kind, 0.05)
    a = FusedEmbeddingBagCollection(tables(), opt, backend="fbgemm", seed=3)
    b = FusedEmbeddingBagCollection(tables(), opt, backend="torch", seed=3)
    for wa, wb in zip(a.table_weights(), b.table_weights()):
        assert torch.equal(wa, wb)  # same seeded initialisation
    outs_a, outs_b = train_steps(a), train_steps(b)
    exact = not opt.has_state  # a stateless update rounds as fbgemm's does
    for oa, ob in zip(outs_a, outs_b):
        torch.testing.assert_close(oa, ob, rtol=0 if exact else 1e-5, atol=0 if exact else 1e-6)
    for wa, wb in zip(a.table_weights(), b.table_weights()):
        if exact:
            assert torch.equal(wa, wb)
        else:
            torch.testing.assert_close(wa, wb, rtol=1e-5, atol=1e-6)
    for sa, sb in zip(a.optimizer_states(), b.optimizer_states()):
        if not opt.has_state:
            assert sa is None and sb is None
        else:
            torch.testing.assert_close(sa, sb, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["fbgemm", "torch"])
def test_sgd_matches_reference_embedding_bags(backend):
    """One fused SGD step equals plain nn.EmbeddingBag (dense gradient) + w -= lr * grad."""
    lr = 0.3
    coll = FusedEmbeddingBagCollection(
        tables(), SparseOptimizer("sgd", lr), backend=backend, seed=1
    )
    refs = [nn.EmbeddingBag(n, 8, mode="sum") for n in SIZES]
    for ref, w in zip(refs, coll.table_weights()):
        ref.weight.data.copy_(w)
    gen = torch.Generator().manual_seed(5)
    kjt = random_kjt(gen, 12)
    out = coll(kjt).values()
    jt = kjt.to_dict()
    ref_out = torch.cat(
        [ref(jt[f"f{i}"].values(), jt[f"f{i}"].offsets()[:-1]) for i, ref in enumerate(refs)], 1
    )
    torch.testing.assert_close(out, ref_out)
    grad = torch.randn(out.shape, generator=gen)
    (out * grad).sum().backward()
    (ref_out * grad).sum().backward()
    for ref, w in zip(refs, coll.table_weights()):
        torch.testing.assert_close(w, ref.weight.data - lr * ref.weight.grad, rtol=1e-6, atol=1e-6)


def test_mixed_dims_torch_path_matches_fbgemm():
    dims = (4, 8, 4, 16)
    a = FusedEmbeddingBagCollection(
        tables(dims), SparseOptimizer("sgd", 0.1), backend="fbgemm", seed=2
    )
    b = FusedEmbeddingBagCollection(
        tables(dims), SparseOptimizer("sgd", 0.1), backend="torch", seed=2
    )
    for oa, ob in zip(train_steps(a), train_steps(b)):
        torch.testing.assert_close(oa, ob, rtol=0, atol=0)
    for wa, wb in zip(a.table_weights(), b.table_weights()):
        assert torch.equal(wa, wb)


def test_state_dict_round_trip_across_backends():
    opt = SparseOptimizer("rowwise_adagrad", 0.1)
    a = FusedEmbeddingBagCollection(tables(), opt, backend="fbgemm", seed=7)
    train_steps(a, steps=2)
    b = FusedEmbeddingBagCollection(tables(), opt, backend="torch", seed=99)
    b.load_state_dict(a.state_dict())
    b.load_sparse_state_dict(a.sparse_state_dict())
    assert sorted(a.state_dict()) == [f"t{i}.weight" for i in range(4)]
    for wa, wb in zip(a.table_weights(), b.table_weights()):
        assert torch.equal(wa, wb)
    for sa, sb in zip(a.optimizer_states(), b.optimizer_states()):
        assert torch.equal(sa, sb)
    # the two continue identically (up to float summation order)
    for oa, ob in zip(train_steps(a, seed=4), train_steps(b, seed=4)):
        torch.testing.assert_close(oa, ob, rtol=1e-5, atol=1e-6)


def test_state_dict_shape_mismatch_is_reported():
    a = FusedEmbeddingBagCollection(tables(), backend="torch")
    sd = a.state_dict()
    sd["t0.weight"] = torch.zeros(49, 8)
    with pytest.raises(
        RuntimeError, match=r"t0.weight: shape \(49, 8\) in the checkpoint, \(50, 8\)"
    ):
        a.load_state_dict(sd)


def test_keys_in_any_order_are_permuted_to_feature_order():
    coll = FusedEmbeddingBagCollection(tables(), backend="torch", seed=1)
    gen = torch.Generator().manual_seed(0)
    kjt = random_kjt(gen, 5)
    perm = kjt.permute([3, 1, 0, 2])
    with torch.no_grad():
        torch.testing.assert_close(coll(kjt).values(), coll(perm).values())
    assert coll(kjt).keys() == ["f0", "f1", "f2", "f3"]


def test_unknown_backend_and_optimizer():
    with pytest.raises(ValueError, match="unknown embedding backend 'x'"):
        FusedEmbeddingBagCollection(tables(), backend="x")
    with pytest.raises(ValueError, match="unknown sparse optimizer 'adam'"):
        SparseOptimizer("adam")


def test_fbgemm_torch_mismatch_is_one_line_with_versions(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def broken(name, *args, **kwargs):
        if name.startswith("fbgemm_gpu"):
            raise OSError(
                "/x/fbgemm_gpu_py.so: undefined symbol: _ZN3c104impl3cow11cow_deleterEPv\nmore"
            )
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", broken)
    with pytest.raises(_fbgemm.FbgemmMismatchError) as err:
        _fbgemm.load_fbgemm()
    msg = str(err.value)
    assert "\n" not in msg
    assert f"with torch {torch.__version__}" in msg and "fbgemm-gpu-cpu 1.8.0" in msg
    assert "undefined symbol" in msg

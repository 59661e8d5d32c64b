import math

import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm.errors import ArchError
from dlrm.models.dlrm import (
    DLRM,
    DLRMArch,
    Interaction,
    NarrowInputLinear,
    PaddedInputLinear,
    make_mlp,
)
from embeddings import FusedEmbeddingBagCollection, tables_for_features

KAGGLE = DLRMArch(
    num_dense=13, embedding_dim=16, num_sparse=26, bottom=(13, 512, 256, 64, 16), top=(512, 256, 1)
)


def n_params(module):
    return sum(p.numel() for p in module.parameters())


def small_model(interaction="dot", itself=False, seed=0, sizes=(20, 30, 5)):
    arch = DLRMArch(3, 4, len(sizes), (3, 8, 4), (6, 1), interaction, itself)
    emb = FusedEmbeddingBagCollection(
        tables_for_features(list(sizes), 4), backend="torch", seed=seed
    )
    return DLRM(arch, emb, seed=seed)


def test_kaggle_parameter_counts_match_reference():
    assert KAGGLE.top_input == 367
    gen = torch.Generator().manual_seed(0)
    assert n_params(make_mlp(KAGGLE.bottom, True, gen)) == 155_984
    assert n_params(make_mlp((KAGGLE.top_input, *KAGGLE.top), False, gen)) == 320_001


def test_top_input_width_for_each_interaction():
    base = dict(num_dense=13, embedding_dim=16, num_sparse=26, bottom=(13, 16), top=(1,))
    assert (
        DLRMArch(**base, interaction="dot", interaction_itself=True).top_input == 27 * 28 // 2 + 16
    )
    assert DLRMArch(**base, interaction="cat").top_input == 27 * 16


@pytest.mark.parametrize("itself", [False, True])
def test_dot_interaction_matches_pairwise_loop(itself):
    gen = torch.Generator().manual_seed(1)
    dense, sparse = torch.randn(5, 4, generator=gen), torch.randn(5, 3 * 4, generator=gen)
    out = Interaction(4, "dot", itself)(dense, sparse)
    feats = [dense] + list(sparse.split(4, dim=1))
    expected = [dense]
    for i in range(4):
        for j in range(i + (1 if itself else 0)):
            expected.append((feats[i] * feats[j]).sum(1, keepdim=True))
    torch.testing.assert_close(out, torch.cat(expected, 1))


@pytest.mark.parametrize("itself", [False, True])
def test_dot_interaction_gradients_match_autograd_reference(itself):
    """The hand-written backward against autograd through bmm + index_select, and gradcheck."""
    gen = torch.Generator().manual_seed(2)
    n, dim = 5, 3
    dense = torch.randn(6, dim, generator=gen, dtype=torch.float64, requires_grad=True)
    sparse = torch.randn(6, (n - 1) * dim, generator=gen, dtype=torch.float64, requires_grad=True)
    inter = Interaction(n, "dot", itself)
    out = inter(dense, sparse)
    grad = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    d_ours, s_ours = torch.autograd.grad(out, [dense, sparse], grad)
    t = torch.cat([dense, sparse], 1).view(6, n, dim)
    ref = torch.cat([dense, torch.bmm(t, t.transpose(1, 2)).flatten(1)[:, inter.tril_flat]], 1)
    d_ref, s_ref = torch.autograd.grad(ref, [dense, sparse], grad)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(d_ours, d_ref)
    torch.testing.assert_close(s_ours, s_ref)
    assert torch.autograd.gradcheck(lambda a, b: inter(a, b), (dense, sparse))


@pytest.mark.parametrize(
    "fan_in, kind", [(13, NarrowInputLinear), (67, PaddedInputLinear), (64, torch.nn.Linear)]
)
def test_cpu_linear_layers_match_nn_linear(fan_in, kind):
    """The layers make_mlp picks by input width compute exactly nn.Linear's function and
    gradients, and behave as nn.Linear under bf16 autocast."""
    gen = torch.Generator().manual_seed(3)
    mlp = make_mlp((fan_in, 32, 4), True, gen)
    assert type(mlp[0]) is kind and type(mlp[2]) is torch.nn.Linear
    plain = torch.nn.Linear(fan_in, 32)
    plain.load_state_dict(mlp[0].state_dict())
    x = torch.randn(7, fan_in, generator=gen, requires_grad=True)
    g = torch.randn(7, 32, generator=gen)
    for layer in (mlp[0], plain):
        layer.zero_grad()
    y_ours, y_ref = mlp[0](x), plain(x)
    torch.testing.assert_close(y_ours, y_ref)
    (gx_ours,) = torch.autograd.grad(y_ours, [x], g, retain_graph=True)
    (gx_ref,) = torch.autograd.grad(y_ref, [x], g, retain_graph=True)
    y_ours.backward(g)
    y_ref.backward(g)
    torch.testing.assert_close(gx_ours, gx_ref)
    torch.testing.assert_close(mlp[0].weight.grad, plain.weight.grad)
    torch.testing.assert_close(mlp[0].bias.grad, plain.bias.grad)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y16, y16_ref = mlp[0](x), plain(x)
    assert y16.dtype == torch.bfloat16
    torch.testing.assert_close(y16, y16_ref, rtol=2e-2, atol=2e-2)
    mlp[0].weight.grad = None
    y16.float().sum().backward()
    assert mlp[0].weight.grad.dtype == torch.float32
    assert mlp[0].weight.grad.shape == mlp[0].weight.shape
    layer64 = mlp[0].double()
    args = (torch.randn(3, fan_in, dtype=torch.float64, generator=gen, requires_grad=True),
            layer64.weight.detach().requires_grad_(), layer64.bias.detach().requires_grad_())  # fmt: skip
    assert torch.autograd.gradcheck(
        lambda a, w, b: torch.func.functional_call(layer64, {"weight": w, "bias": b}, (a,)), args
    )


def test_cat_interaction():
    dense, sparse = torch.randn(2, 4), torch.randn(2, 8)
    torch.testing.assert_close(
        Interaction(3, "cat", False)(dense, sparse), torch.cat([dense, sparse], 1)
    )


def test_initialisation_follows_reference_scales_and_is_seeded():
    gen = torch.Generator().manual_seed(0)
    mlp = make_mlp((400, 300, 1), False, gen)
    w, b = mlp[0].weight, mlp[0].bias
    assert abs(w.std().item() - math.sqrt(2 / 700)) < 0.002
    assert abs(b.std().item() - math.sqrt(1 / 300)) < 0.01
    a, c = small_model(seed=4), small_model(seed=4)
    for (ka, va), (kc, vc) in zip(a.state_dict().items(), c.state_dict().items()):
        assert ka == kc and torch.equal(va, vc)
    emb = a.embeddings.table_weights()[1]
    assert emb.abs().max() <= math.sqrt(1 / 30) and emb.abs().max() > 0.8 * math.sqrt(1 / 30)


def test_forward_shapes_and_dense_parameters_exclude_embeddings():
    m = small_model()
    kjt = KeyedJaggedTensor(
        ["cat_0", "cat_1", "cat_2"],
        torch.tensor([1, 2, 3, 4, 0, 1]),
        lengths=torch.ones(6, dtype=torch.int32),
    )
    logits = m(torch.randn(2, 3), kjt)
    assert logits.shape == (2,)
    dense_ids = {id(p) for p in m.dense_parameters()}
    assert dense_ids == {id(p) for p in m.parameters()}  # embeddings are not nn.Parameters
    assert len(m.dense_parameters()) == 8


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(bottom=(13, 64, 8)),
            r"^bottom: last width \(8\) must equal the embedding dimension \(16\)",
        ),
        (
            dict(bottom=(12, 16)),
            r"^bottom: first width must be the number of dense features \(13\)",
        ),
        (dict(top=(64, 2)), r"^top: last width must be 1"),
        (dict(interaction="sum"), r"^interaction: expected dot or cat"),
    ],
)
def test_inconsistent_architecture_names_the_field(kwargs, message):
    """Models name their own fields; the CLI names flags (tests/dlrm/test_cli.py)."""
    base = dict(num_dense=13, embedding_dim=16, num_sparse=26, bottom=(13, 16), top=(1,))
    base.update(kwargs)
    with pytest.raises(ArchError, match=message):
        DLRMArch(**base)

"""TBSM model: the batched forward equals a step-by-step reference (the loop the original code
runs), every variant's modules are registered, configuration mistakes are one-line errors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm.config import ConfigError, TrainConfig
from dlrm.models.tbsm import TBSM, TBSMArch
from embeddings import FusedEmbeddingBagCollection, SparseOptimizer, tables_for_features

T, B, SIZES, NAMES = 3, 5, [7, 11, 4], ["user", "item", "category"]


def _model(**kw) -> TBSM:
    arch = TBSMArch(num_dense=1, embedding_dim=4, num_sparse=3, bottom=(1, 4), top=(6, 5), ts_length=T,
                    tsl_mlp=(6,), arch_mlp=(7, 1), mha_num_heads=2, **kw)  # fmt: skip
    emb = FusedEmbeddingBagCollection(
        tables_for_features(SIZES, 4, NAMES), SparseOptimizer("sgd", 0.1), backend="torch", seed=1
    )
    with torch.no_grad():  # larger rows than the reference init, so differences are visible
        for w in emb.table_weights():
            w.mul_(10)
    return TBSM(arch, emb, seed=2)


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = [torch.randint(0, n, (B, T + 1), generator=g) for n in SIZES]
    dense = (torch.arange(T + 1, dtype=torch.float32) / (T + 1)).repeat(B).view(-1, 1)
    kjt = KeyedJaggedTensor(keys=NAMES, values=torch.cat([i.reshape(-1) for i in ids]),
                            lengths=torch.ones(3 * B * (T + 1), dtype=torch.int32))  # fmt: skip
    return dense, kjt, ids


def _reference(model: TBSM, ids, dense) -> torch.Tensor:
    """Step by step: the per-step DLRM on each step's own KJT, then the TSL written out."""
    a = model.arch
    zs = []
    for j in range(T + 1):
        kjt = KeyedJaggedTensor(keys=NAMES, values=torch.cat([i[:, j] for i in ids]),
                                lengths=torch.ones(3 * B, dtype=torch.int32))  # fmt: skip
        zs.append(model.step(dense.view(B, T + 1, 1)[:, j], kjt))
    H, w = torch.stack(zs[:T], dim=1), zs[T]
    if a.model_type != "tsl":
        return None
    if a.tsl_proj:
        H = H / H.norm(dim=2, keepdim=True).clamp_min(1e-12)
        w = w / w.norm(dim=1, keepdim=True).clamp_min(1e-12)
    logits = []
    for head, mlp in zip(model.heads, model.head_mlps):
        if a.tsl_inner == "dot":
            x = w
        else:
            ax = torch.stack([head.A @ w[b] for b in range(B)])  # A w, sample by sample
            x = ax if a.tsl_inner == "ind" else torch.stack([head.A.T @ ax[b] for b in range(B)])
        scores = torch.stack([(H[:, t] * x).sum(1) for t in range(T)], dim=1)
        if a.tsl_mechanism == "mlp":
            scores = torch.sigmoid(head.attention_mlp[:-1](scores))
        c = sum(scores[:, t : t + 1] * H[:, t] for t in range(T)) / T  # the mean, not the sum
        logits.append(mlp(torch.cat([c, w], dim=1)))
    out = torch.cat(logits, dim=1)
    return (model.combine(out) if len(logits) > 1 else out).squeeze(1)


@pytest.mark.parametrize("inner", ["dot", "ind", "def"])
@pytest.mark.parametrize("mechanism", ["mul", "mlp"])
@pytest.mark.parametrize("heads,proj", [(1, True), (2, False)])
def test_tsl_matches_step_by_step_reference(inner, mechanism, heads, proj):
    model = _model(tsl_inner=inner, tsl_mechanism=mechanism, tsl_num_heads=heads, tsl_proj=proj)
    dense, kjt, ids = _batch()
    got = model(dense, kjt)
    assert got.shape == (B,)
    torch.testing.assert_close(got, _reference(model, ids, dense), rtol=1e-5, atol=1e-6)
    # the per-step DLRM ran once on all B*(T+1) steps: same z as step by step
    z = model.encode_steps(dense, kjt)
    assert z.shape == (B, T + 1, 5)


def test_mha_and_rnn_modules_are_registered_and_get_gradients():
    dense, kjt, ids = _batch(1)
    for kind, names in (("mha", ("query.weight", "attention.in_proj_weight", "attention.k_proj_weight")),
                        ("rnn", ("lstm.weight_ih_l0", "lstm.weight_hh_l0"))):  # fmt: skip
        model = _model(model_type=kind)
        params = dict(model.named_parameters())
        dense_ids = {id(p) for p in model.dense_parameters()}
        for n in names:
            if n in params:  # MultiheadAttention has in_proj or separate k/v weights
                assert id(params[n]) in dense_ids
        # same seed, same weights: the modules are built once, deterministically
        again = _model(model_type=kind)
        assert all(
            torch.equal(a, b)
            for a, b in zip(model.state_dict().values(), again.state_dict().values())
        )
        model(dense, kjt).sum().backward()
        grads = [
            p.grad
            for n, p in model.named_parameters()
            if n.startswith(("attention", "lstm", "query"))
        ]
        assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)


def test_rnn_context_is_lstm_final_state():
    model = _model(model_type="rnn")
    dense, kjt, ids = _batch(2)
    z = model.encode_steps(dense, kjt)
    H, w = z[:, :T], z[:, T]
    h, c = torch.zeros(1, B, 5), torch.zeros(1, B, 5)
    for t in range(T):
        _, (h, c) = model.lstm(H[:, t : t + 1], (h, c))
    expected = model.head_mlps[0](torch.cat([h[-1], w], dim=1)).squeeze(1)
    torch.testing.assert_close(model(dense, kjt), expected)


def test_mha_context_is_attention_from_candidate():
    model = _model(model_type="mha")
    dense, kjt, ids = _batch(3)
    z = model.encode_steps(dense, kjt)
    H, w = z[:, :T], z[:, T]
    q = model.query(w)
    att = model.attention
    Wq, Wk, Wv = (
        att.in_proj_weight.chunk(3)
        if att.in_proj_weight is not None
        else (att.q_proj_weight, att.k_proj_weight, att.v_proj_weight)
    )
    bq, bk, bv = att.in_proj_bias.chunk(3)
    heads, d = 2, 10 // 2
    Q = (q @ Wq.T + bq).view(B, heads, d)
    K = (H @ Wk.T + bk).view(B, T, heads, d)
    V = (H @ Wv.T + bv).view(B, T, heads, d)
    attn = torch.softmax(torch.einsum("bhd,bthd->bht", Q, K) / math.sqrt(d), dim=2)
    c = att.out_proj(torch.einsum("bht,bthd->bhd", attn, V).reshape(B, 10))
    expected = model.head_mlps[0](torch.cat([c, w], dim=1)).squeeze(1)
    torch.testing.assert_close(model(dense, kjt), expected, rtol=1e-5, atol=1e-6)


def test_arch_and_config_errors(tmp_path):
    with pytest.raises(ValueError, match="^tsl_inner: expected one of dot, ind, def, got 'cos'"):
        _model(tsl_inner="cos")
    with pytest.raises(ValueError, match="^arch_mlp: last width must be 1"):
        TBSMArch(
            num_dense=1, embedding_dim=4, num_sparse=3, bottom=(1, 4), top=(5,), arch_mlp=(7, 2)
        )
    with pytest.raises(ConfigError, match="--model-type: expected one of tsl, mha, rnn, got 'gru'"):
        TrainConfig(model="tbsm", model_type="gru")
    with pytest.raises(ConfigError, match="--tsl-mlp: expected dash-separated integers"):
        TrainConfig(tsl_mlp="15-x")
    from dlrm.data import build_data

    with pytest.raises(ConfigError, match="--model tbsm: needs --data-set taobao"):
        build_data(TrainConfig(model="tbsm", out_dir=str(tmp_path)))
    assert F.normalize  # keeps the import honest for the reference's L2 projection

"""The written-out dense step (dlrm/pipelines/dense_step.py) computes what autograd computes through the
model's dense part, applies plain SGD as torch's SGD does (and nothing on a non-finite loss), and
a trainer running it (traced by Dynamo with the eager backend: no Inductor build) trains exactly
as the autograd step does, with SGD inside the step and with Adagrad outside it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dlrm.models.dlrm import DLRM, DLRMArch
from dlrm.pipelines import compile as compile_
from dlrm.pipelines import dense_step
from dlrm.pipelines.base import loss_of
from dlrm.trainer import Trainer
from tests.dlrm.conftest import tiny


def _model(interaction: str = "dot", itself: bool = False) -> DLRM:
    # 5 tables of dim 8: the top input (15 or 21 pairs + 8, or 48) is padded to a multiple of 8
    arch = DLRMArch(num_dense=13, embedding_dim=8, num_sparse=5, bottom=(13, 24, 8),
                    top=(20, 12, 1), interaction=interaction, interaction_itself=itself)  # fmt: skip
    return DLRM(arch, nn.Module(), seed=3)


def _inputs(batch: int = 32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    dense = torch.rand(batch, 13, generator=g)
    pooled = torch.randn(batch, 5 * 8, generator=g) * 0.3
    labels = torch.randint(0, 2, (batch,), generator=g).float()
    return dense, pooled, labels


def _autograd(model: DLRM, dense, pooled, labels, precision: str, loss: str):
    pooled = pooled.clone().requires_grad_()
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        logits = model.dense_forward(dense, pooled)
    value = loss_of(logits, labels, loss)
    value.backward()
    return value.detach(), pooled.grad, [p.grad for p in model.dense_parameters()]


@pytest.mark.parametrize(
    "precision,interaction,itself,loss",
    [("fp32", "dot", False, "bce"), ("bf16", "dot", False, "bce"), ("fp32", "dot", True, "mse"),
     ("fp32", "cat", False, "bce"), ("bf16", "cat", False, "mse")],
)  # fmt: skip
def test_written_step_equals_autograd(precision, interaction, itself, loss):
    model = _model(interaction, itself)
    assert dense_step.supports(model)
    dense, pooled, labels = _inputs()
    want_loss, want_pooled, want_grads = _autograd(model, dense, pooled, labels, precision, loss)
    step = dense_step.WrittenDenseStep(model, precision, loss)
    assert step.parameters() == model.dense_parameters()
    with torch.no_grad():
        got_loss, got_pooled, got_grads = step(dense, pooled, labels)
    # the same operations on the same operands: equal up to the last bit but for mse's gradient,
    # whose factors autograd multiplies in another order
    tol = dict(rtol=1e-6, atol=1e-7) if loss == "bce" else dict(rtol=1e-5, atol=1e-6)
    if precision == "bf16" and loss == "mse":
        tol = dict(rtol=2e-2, atol=1e-4)  # rounded to bf16 along the way
    torch.testing.assert_close(got_loss, want_loss, **tol)
    torch.testing.assert_close(got_pooled, want_pooled, **tol)
    assert len(got_grads) == len(want_grads)
    for got, want in zip(got_grads, want_grads):
        assert got.dtype == torch.float32 and got.shape == want.shape
        torch.testing.assert_close(got, want, **tol)


def test_sgd_in_the_step_equals_torch_sgd_and_skips_a_non_finite_loss():
    model, reference = _model(), _model()
    dense, pooled, labels = _inputs()
    step = dense_step.WrittenDenseStep(model, "fp32", "bce")
    sgd = torch.optim.SGD(reference.dense_parameters(), lr=0.5, fused=True)
    assert dense_step.plain_sgd_lr(sgd, reference.dense_parameters()) == 0.5
    lr = torch.tensor(0.5, dtype=torch.float64)
    it = model.interaction
    with torch.no_grad():
        loss, _, grads = step.step(dense, pooled, labels, step.params, it.tril_flat,
                                   it.grad_map, it.diagonal, lr)  # fmt: skip
    assert grads == [] and torch.isfinite(loss)
    _autograd(reference, dense, pooled, labels, "fp32", "bce")
    sgd.step()
    for got, want in zip(model.dense_parameters(), reference.dense_parameters()):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    before = [p.detach().clone() for p in model.dense_parameters()]
    with torch.no_grad():
        loss, _, _ = step.step(dense, pooled, torch.full_like(labels, float("nan")), step.params,
                               it.tril_flat, it.grad_map, it.diagonal, lr)  # fmt: skip
    assert not torch.isfinite(loss)
    for got, want in zip(model.dense_parameters(), before):
        assert torch.equal(got, want)


def test_which_optimizers_and_models_the_step_takes():
    model = _model()
    params = model.dense_parameters()
    assert dense_step.plain_sgd_lr(torch.optim.SGD(params, lr=0.1, momentum=0.9), params) is None
    assert dense_step.plain_sgd_lr(torch.optim.Adagrad(params, lr=0.1), params) is None
    assert dense_step.plain_sgd_lr(torch.optim.SGD(params[:2], lr=0.1), params) is None
    model.top_mlp.append(nn.Sigmoid())  # not a Linear/ReLU MLP: the autograd step runs it
    assert not dense_step.supports(model)
    assert not dense_step.supports(nn.Linear(2, 2))


def test_auto_compiles_fp32_only_for_long_runs_of_small_batches():
    assert compile_.wanted(None, "bf16")
    assert compile_.wanted(None, "fp32", 128, 10**6, written=True)
    assert not compile_.wanted(None, "fp32", 128, 10**6, written=False)  # e.g. TBSM
    assert not compile_.wanted(None, "fp32", 128, 100, written=True)  # the compile would not pay
    assert not compile_.wanted(None, "fp32", 2048, 10**6, written=True)  # GEMM-bound
    assert not compile_.wanted(False, "bf16") and compile_.wanted(True, "fp32")


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_a_trainer_on_the_written_step_trains_as_the_autograd_step(
    tmp_path, monkeypatch, optimizer
):
    torch._dynamo.reset()
    monkeypatch.setattr(compile_, "BACKEND", "eager")
    kw = dict(optimizer=optimizer, data_size=64 * 6 + 20, test_data_size=256)  # a short last batch
    written = Trainer(tiny(tmp_path / "written", compile=True, **kw), checkpoints=False)
    calls = {"steps": 0}
    compiled = written.pipeline.written
    real = compiled.train_step

    def counted(*args):
        out = real(*args)
        calls["steps"] += out is not None
        return out

    monkeypatch.setattr(compiled, "train_step", counted)
    got = written.fit()
    autograd = Trainer(tiny(tmp_path / "autograd", compile=False, **kw), checkpoints=False)
    want = autograd.fit()
    assert calls["steps"] == 7 and got["steps"] == want["steps"] == 7
    assert got["test_auc"] == pytest.approx(want["test_auc"], abs=1e-6)
    got_state, want_state = written.model.state_dict(), autograd.model.state_dict()
    for name, value in want_state.items():
        torch.testing.assert_close(got_state[name], value, rtol=1e-5, atol=1e-6, msg=name)
    torch._dynamo.reset()

"""A DLRM's dense training step written out: forward, loss and backward of everything after the
embedding lookup as one function, so that `--compile` makes it one TorchInductor graph.

Through autograd, a compiled dense part is still two graphs (forward, backward) stitched together
by the autograd engine, with a guard check, runtime wrappers, an accumulate-grad node per
parameter and a zero_grad before each step. At batch 128 those fixed costs are a large share of a
step whose matrix products take a few milliseconds (docs/speed.md). Written out, one compiled call
returns the loss, the gradient of every dense parameter and the gradient of the pooled
embeddings; the trainer then hands the latter to the embedding collection's backward (which
applies its fused sparse update) and steps the dense optimizer as before.

The arithmetic is the autograd step's: the same layers in the same layouts (`NarrowInputLinear`,
`PaddedInputLinear`), the same dot interaction (`_DotInteractionFn`), the loss in float32, and in
bf16 what autocast does (weights, activations and pooled embeddings cast to bf16, every gradient
of a parameter cast back to float32). tests/dlrm/test_dense_step.py checks it against autograd.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dlrm.models.dlrm import DLRM, NarrowInputLinear, PaddedInputLinear


@dataclass(frozen=True)
class Layer:
    """One linear layer of an MLP as the written-out step runs it."""

    kind: str  # "narrow" (NarrowInputLinear's layouts), "padded" (input padded to `width`), "plain"
    width: int  # the reduction width the GEMMs run at (the input width, padded for "padded")
    relu: bool  # a ReLU follows


def _layers(mlp: nn.Sequential) -> tuple[list[nn.Linear], tuple[Layer, ...]]:
    mods = list(mlp)
    linears, layers = [], []
    for i, m in enumerate(mods):
        if isinstance(m, nn.Linear):
            relu = i + 1 < len(mods) and isinstance(mods[i + 1], nn.ReLU)
            if isinstance(m, NarrowInputLinear):
                kind, width = "narrow", m.in_features
            elif isinstance(m, PaddedInputLinear):
                kind, width = "padded", m.padded_width()
            else:
                kind, width = "plain", m.in_features
            linears.append(m)
            layers.append(Layer(kind, width, relu))
        elif not isinstance(m, nn.ReLU):
            raise TypeError(f"written-out dense step: unexpected {type(m).__name__} in an MLP")
    return linears, tuple(layers)


def supports(model: nn.Module) -> bool:
    """The models whose dense step is written out here: DLRM with the dot or cat interaction and
    plain Linear/ReLU MLPs."""
    if type(model) is not DLRM or model.interaction.kind not in ("dot", "cat"):
        return False  # dcn: the compiled forward under autograd (dlrm/pipelines/compile.py)
    try:
        _layers(model.bottom_mlp), _layers(model.top_mlp)
    except TypeError:
        return False
    return True


def _forward(x: torch.Tensor, layers: tuple[Layer, ...], params: list[torch.Tensor], dtype):
    """The MLP's output and, per layer, what its backward needs: its (padded) input and weight."""
    saved = []
    for layer, (w, b) in zip(layers, zip(params[::2], params[1::2])):
        w, b = w.to(dtype), b.to(dtype)
        if layer.kind == "narrow":
            y = torch.addmm(b, x, w.t().contiguous())
        else:
            if layer.kind == "padded":
                x = F.pad(x, (0, layer.width - x.shape[1]))
                w = F.pad(w, (0, layer.width - w.shape[1]))
            y = torch.addmm(b, x, w.t())
        saved.append((x, w))
        x = torch.relu(y) if layer.relu else y
    return x, saved


def _backward(g, out, layers, saved, fan_ins, needs_input_grad: bool):
    """Through the MLP backwards from dL/d(out): the input's gradient and the parameters' (float32,
    in the order of `params`)."""
    grads: list[torch.Tensor] = []
    for i in reversed(range(len(layers))):
        layer, (x, w) = layers[i], saved[i]
        if layer.relu:
            g = g * (out > 0)
        fan_in = fan_ins[i]
        if layer.kind == "narrow":
            gw = x.t().mm(g).t()
        else:
            gw = g.t().mm(x)[:, :fan_in]
        grads[:0] = [gw.float().contiguous(), g.sum(0).float()]
        if i > 0 or needs_input_grad:
            g = g.mm(w)[:, :fan_in]
        out = x[:, :fan_in]
    return g, grads


class WrittenDenseStep:
    """`step(dense, pooled, labels) -> (loss, dL/dpooled, [dL/dparam])` for a DLRM, pure in its
    tensor arguments (the parameters are read from the model on each call, never cached)."""

    def __init__(self, model: DLRM, precision: str, loss_function: str) -> None:
        self.model = model
        self.dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        self.loss_function = loss_function
        bottom, self.bottom = _layers(model.bottom_mlp)
        top, self.top = _layers(model.top_mlp)
        self.bottom_in = tuple(m.in_features for m in bottom)
        self.top_in = tuple(m.in_features for m in top)
        self.kind = model.interaction.kind
        self.params = [p for m in (*bottom, *top) for p in (m.weight, m.bias)]
        self.split = 2 * len(bottom)

    def parameters(self) -> list[nn.Parameter]:
        """What `step` returns gradients for, in order."""
        return self.params

    def __call__(self, dense, pooled, labels):
        it = self.model.interaction
        return self.step(dense, pooled, labels, self.params, it.tril_flat, it.grad_map, it.diagonal)

    def step(self, dense, pooled, labels, params, pairs, grad_map, diagonal, lr=None):
        """`lr` (a 0-dim tensor): also apply plain SGD to `params` in place, unless the loss is
        not finite (as the autograd step, which raises before any update), and return no
        gradients: fused with the gradients' casts, the update saves writing and reading them."""
        dtype = self.dtype
        bottom_p, top_p = params[: self.split], params[self.split :]
        bot, bottom_saved = _forward(dense.to(dtype), self.bottom, bottom_p, dtype)
        batch, dim = bot.shape
        sparse = pooled.to(dtype)
        if self.kind == "cat":
            z = torch.cat([bot, sparse], dim=1)
        else:
            t = torch.cat([bot, sparse], dim=1).view(batch, -1, dim)
            t_t = t.transpose(1, 2).contiguous()
            zz = torch.bmm(t_t.transpose(1, 2), t_t).flatten(1)
            z = torch.cat([bot, torch.gather(zz, 1, pairs.expand(batch, -1))], dim=1)
        out, top_saved = _forward(z, self.top, top_p, dtype)
        logits = out.float().squeeze(1)
        if self.loss_function == "mse":
            s = torch.sigmoid(logits)
            loss = F.mse_loss(s, labels)
            g = 2.0 * (s - labels) * s * (1.0 - s) / batch
        else:
            loss = F.binary_cross_entropy_with_logits(logits, labels)
            g = (torch.sigmoid(logits) - labels) / batch
        g = g.unsqueeze(1).to(dtype)
        g, top_grads = _backward(g, out, self.top, top_saved, self.top_in, True)
        if self.kind == "cat":
            g_bot, g_sparse = g[:, :dim], g[:, dim:]
        else:
            n = t.shape[1]
            g_z = g[:, dim:]
            extended = torch.cat(
                [g_z.new_zeros(batch, 1), g_z, 2 * g_z.index_select(1, diagonal)], dim=1
            )
            gm = torch.gather(extended, 1, grad_map.expand(batch, -1)).view(batch, n, n)
            g_t = torch.bmm(gm, t).flatten(1)
            g_bot, g_sparse = g[:, :dim] + g_t[:, :dim], g_t[:, dim:]
        _, bottom_grads = _backward(g_bot, bot, self.bottom, bottom_saved, self.bottom_in, False)
        grads = bottom_grads + top_grads
        if lr is not None:
            finite = torch.isfinite(loss)
            for p, g in zip(params, grads):
                p.copy_(torch.where(finite, p - lr * g, p))
            grads = []
        return loss, g_sparse.to(pooled.dtype), grads


def plain_sgd_lr(optimizer: torch.optim.Optimizer, params: list[nn.Parameter]) -> float | None:
    """The learning rate when `optimizer` is plain SGD (no momentum, weight decay or maximize, one
    group) over exactly `params`: an update the written-out step can apply itself; else None."""
    if type(optimizer) is not torch.optim.SGD or len(optimizer.param_groups) != 1:
        return None
    group = optimizer.param_groups[0]
    if group["momentum"] or group["weight_decay"] or group["maximize"]:
        return None
    if len(group["params"]) != len(params) or any(
        a is not b for a, b in zip(group["params"], params)
    ):
        return None
    return float(group["lr"])

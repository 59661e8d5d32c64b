"""fbgemm's table-batched lookup on CPU, its fused SGD update run in parallel.

fbgemm-gpu's CPU backward for exact SGD runs on one thread ("TODO: to parallelize" in its
template), and its module's forward runs Python around the operator on every call (input
preparation, a second bounds check, statistics). Both weigh most at small batches; at large ones
the update is bound by the rows' cache misses (docs/measurements/speed.md, issue 47 part 3).
fbgemm's row-wise Adagrad has a parallel kernel and stays as it is; its exact Adagrad is serial
too, but rounds in a way this loop does not reproduce bit for bit, so it stays fbgemm's.

`ParallelUpdateLookup` keeps fbgemm's module (its weights, learning rate, checkpoint views)
and its forward operator, and replaces only the backward: one numba loop, parallel over tables,
that does what fbgemm's does, bit for bit on a CPU with FMA (tests/embeddings/test_cpu_tbe.py):
per table, each row's gradient summed over its lookups in batch order, starting from zero, in
float32, then one update per row with a fused multiply-add where fbgemm's compiled loop has one.
Tables are independent, so the threads never touch the same row.

A bad id cannot reach the update: fbgemm's forward refuses it first; the loop checks again
because it writes where the id points.
"""

from __future__ import annotations

import numba
import numpy as np
import torch

from embeddings.optimizer import SparseOptimizer

SUM_POOLING = 0  # fbgemm's PoolingMode.SUM
FP32_OUTPUT = 0  # fbgemm's SparseType.FP32


def applies(optimizer: SparseOptimizer, device: torch.device) -> bool:
    """Whether fbgemm's module for `optimizer` on `device` gets the parallel update: SGD (the
    stateless optimizer) on CPU."""
    return device.type == "cpu" and not optimizer.has_state


class _Lookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, placeholder, lookup, indices, offsets):  # type: ignore[override]
        ctx.lookup = lookup
        ctx.save_for_backward(indices, offsets)
        m = lookup.tbe
        return torch.ops.fbgemm.split_embedding_codegen_forward_cpu(
            m.weights_host, m.weights_offsets, m.D_offsets, m.total_D, m.hash_size_cumsum,
            indices, offsets, SUM_POOLING, None, FP32_OUTPUT,
        )  # fmt: skip

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        indices, offsets = ctx.saved_tensors
        ctx.lookup.update(indices, offsets, grad_out)
        return None, None, None, None


class ParallelUpdateLookup:
    """`lookup(indices, offsets)` as fbgemm's module `tbe` computes it (table-major bags,
    sum-pooled, float32), the fused update parallel over tables."""

    def __init__(self, tbe: torch.nn.Module) -> None:
        self.tbe = tbe
        self._placeholder = torch.zeros(0, requires_grad=True)
        self._woff = tbe.weights_offsets.numpy()
        self._doff = tbe.D_offsets.numpy().astype(np.int64)
        self._rows = np.diff(tbe.hash_size_cumsum.numpy())[: self._woff.size].astype(np.int64)

    def __call__(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return _Lookup.apply(self._placeholder, self, indices, offsets)

    def update(self, indices: torch.Tensor, offsets: torch.Tensor, grad: torch.Tensor) -> None:
        """SGD on every row the bags looked up, with `grad` [B, total_D]."""
        grad = grad.float().contiguous()
        tables = self._woff.size
        batch = (offsets.numel() - 1) // tables
        bad, _ = _sgd(
            self.tbe.weights_host.detach().numpy(), self._woff, self._doff, self._rows,
            indices.numpy(), offsets.numpy(), grad.numpy(), batch, self.tbe.get_learning_rate(),
        )  # fmt: skip
        if bad >= 0:
            raise IndexError(f"embedding update: id out of range in table {bad}")


@numba.njit(parallel=True, cache=True, fastmath={"contract"})
def _sgd(w, woff, doff, rows, idx, off, grad, batch, lr):
    """fbgemm's exact CPU SGD (w -= lr * g) of every looked-up row, tables in parallel; returns
    the first table with an id out of range (nothing of it written) or -1, and a sum of no
    meaning (the rows' first reads, which nothing else uses)."""
    tables = woff.size
    bad = np.zeros(tables, np.bool_)  # a table with an id out of range
    seen = np.zeros(tables, np.float32)  # the reads' sums, kept so that they are not optimised out
    lr32 = np.float32(lr)
    for t in numba.prange(tables):
        lo, hi = off[t * batch], off[(t + 1) * batch]
        n = hi - lo
        if n == 0:
            continue
        # the table's distinct rows in order of first lookup, and each lookup's slot among them
        cap = 16
        while cap < 2 * n:
            cap *= 2
        keys = np.full(cap, -1, np.int64)
        slot_at = np.empty(cap, np.int64)
        slot = np.empty(n, np.int64)
        unique = np.empty(n, np.int64)
        m = 0
        for p in range(lo, hi):
            r = np.int64(idx[p])
            if r < 0 or r >= rows[t]:
                bad[t] = True
                break
            h = (r * np.int64(2654435761)) & (cap - 1)
            while keys[h] != -1 and keys[h] != r:
                h = (h + 1) & (cap - 1)
            if keys[h] == -1:
                keys[h] = r
                slot_at[h] = m
                unique[m] = r
                m += 1
            slot[p - lo] = slot_at[h]
        if bad[t]:
            continue
        d0 = doff[t]
        dim = doff[t + 1] - d0
        # read every row first, in a loop of loads alone: the CPU keeps many of their cache
        # misses in flight at once, where the update loop (load, add, store) keeps few; the rows
        # are then in cache when it writes them
        touched = np.float32(0.0)
        for s in range(m):
            touched += w[woff[t] + unique[s] * dim]
        seen[t] = touched
        acc = np.zeros((m, dim), np.float32)
        for b in range(batch):  # batch order within each row, as fbgemm sums
            for p in range(off[t * batch + b], off[t * batch + b + 1]):
                s = slot[p - lo]
                for d in range(dim):
                    acc[s, d] += grad[b, d0 + d]
        for s in range(m):
            e = woff[t] + unique[s] * dim
            for d in range(dim):
                w[e + d] -= lr32 * acc[s, d]  # one fused multiply-add, as fbgemm's
    for t in range(tables):
        if bad[t]:
            return t, seen.sum()
    return -1, seen.sum()

"""A table-batched embedding bag in plain PyTorch, with the sparse optimizer fused into backward.

It is the fallback where fbgemm has no kernel for the device (a CPU-only fbgemm build with CUDA
tensors, or no fbgemm at all) and the reference the fbgemm path is tested against. Its interface
mirrors the subset of fbgemm's `SplitTableBatchedEmbeddingBagsCodegen` the collections use:
`forward(indices, offsets)` with table-major bags, per-table weight and optimizer-state views,
`set_learning_rate`.

Tables of equal width share one weight tensor, so one `embedding_bag` call serves them all.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from embeddings.optimizer import SparseOptimizer


def apply_sparse_update(
    weight: torch.Tensor,
    state: torch.Tensor | None,
    rows: torch.Tensor,
    grad: torch.Tensor,
    opt: SparseOptimizer,
    lr: float,
) -> None:
    """Update `weight[rows]` in place with the gradient `grad` (one row of `grad` per unique row).

    Rows are unique, so the update is gather, add, write back: on CPU that is about 3x faster
    than `index_add_` with alpha != 1 (a per-row loop) and rounds the same way (one fused
    multiply-add per element, as fbgemm's SGD)."""
    if not opt.has_state:
        add_unique_rows(weight, rows, grad, -lr)
        return
    assert state is not None
    s = state.index_select(0, rows)
    opt.accumulate_(s, grad)
    state.index_copy_(0, rows, s)
    add_unique_rows(weight, rows, grad / opt.denominator_(s), -lr)


def add_unique_rows(
    weight: torch.Tensor, rows: torch.Tensor, delta: torch.Tensor, alpha: float
) -> None:
    """weight[rows] += alpha * delta for unique `rows`."""
    weight.index_copy_(0, rows, weight.index_select(0, rows).add_(delta, alpha=alpha))


def segment_sum_rows(
    indices: torch.Tensor, offsets: torch.Tensor, grad_bags: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradient per unique row for sum-pooled bags: (unique rows, summed gradient per row)."""
    lengths = offsets[1:] - offsets[:-1]
    per_lookup = grad_bags.repeat_interleave(lengths, dim=0, output_size=indices.numel())
    rows, inverse = torch.unique(indices, return_inverse=True)
    grad = torch.zeros(
        rows.numel(), grad_bags.shape[1], dtype=grad_bags.dtype, device=grad_bags.device
    )
    grad.index_add_(0, inverse, per_lookup)
    return rows, grad


class FusedLookup(torch.autograd.Function):
    """embedding_bag(sum) whose backward updates the weight instead of returning its gradient.

    `table` is anything with a `weight` tensor and an `update(rows, grad)` method: a `_Group`
    here, a `DeviceTier` (embeddings/memory_tiers.py) in the FAE collection.
    """

    @staticmethod
    def forward(ctx, placeholder, table, indices, offsets):  # type: ignore[override]
        ctx.table = table
        ctx.save_for_backward(indices, offsets)
        return F.embedding_bag(indices, table.weight, offsets[:-1], mode="sum")

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        indices, offsets = ctx.saved_tensors
        ctx.table.update(*segment_sum_rows(indices, offsets, grad_out.float()))
        return None, None, None, None


class _Group:
    """Tables of one width, stored back to back in one weight tensor."""

    def __init__(self, table_ids, rows, dim, optimizer: SparseOptimizer, device) -> None:
        self.table_ids = table_ids
        self.rows = rows
        self.optimizer = optimizer
        self.lr = optimizer.learning_rate
        total = sum(rows)
        self.row_offsets = [0]
        for r in rows[:-1]:
            self.row_offsets.append(self.row_offsets[-1] + r)
        self.weight = torch.zeros(total, dim, dtype=torch.float32, device=device)
        self.state = optimizer.zero_state(total, dim, device=device)

    def update(self, rows: torch.Tensor, grad: torch.Tensor) -> None:
        apply_sparse_update(self.weight, self.state, rows, grad, self.optimizer, self.lr)


class TorchTableBatchedEmbedding(torch.nn.Module):
    """Sum-pooled lookups into many tables at once, optimizer fused into backward."""

    def __init__(
        self, rows: list[int], dims: list[int], optimizer: SparseOptimizer, device: torch.device
    ) -> None:
        super().__init__()
        self.rows_per_table = list(rows)
        self.dims = list(dims)
        self.optimizer = optimizer
        self._placeholder = torch.zeros(0, device=device, requires_grad=True)
        self.groups: list[_Group] = []
        self._slot: list[tuple[int, int]] = []  # table -> (group, position in group)
        by_dim: dict[int, list[int]] = {}
        for t, d in enumerate(dims):
            by_dim.setdefault(d, []).append(t)
        slot = {}
        for g, (d, ts) in enumerate(by_dim.items()):
            self.groups.append(_Group(ts, [rows[t] for t in ts], d, optimizer, device))
            for i, t in enumerate(ts):
                slot[t] = (g, i)
        self._slot = [slot[t] for t in range(len(dims))]
        self._single = len(self.groups) == 1

    def set_learning_rate(self, lr: float) -> None:
        for g in self.groups:
            g.lr = float(lr)

    def split_embedding_weights(self) -> list[torch.Tensor]:
        out = []
        for g, i in self._slot:
            grp = self.groups[g]
            o = grp.row_offsets[i]
            out.append(grp.weight[o : o + grp.rows[i]])
        return out

    def split_optimizer_states(self) -> list[torch.Tensor | None]:
        out = []
        for g, i in self._slot:
            grp = self.groups[g]
            o = grp.row_offsets[i]
            out.append(None if grp.state is None else grp.state[o : o + grp.rows[i]])
        return out

    def forward(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """indices/offsets are table-major (all bags of table 0, then table 1, ...), as in fbgemm."""
        num_tables = len(self.dims)
        batch = (offsets.numel() - 1) // num_tables
        if self._single:
            return self._group_forward(self.groups[0], indices, offsets, batch)
        pieces = []
        for grp in self.groups:
            sel_ind, sel_off = _select_tables(indices, offsets, grp.table_ids, batch)
            pieces.append(self._group_forward(grp, sel_ind, sel_off, batch))
        # Put the groups' columns back in table order.
        by_table = {}
        for grp, piece in zip(self.groups, pieces):
            d = piece.shape[1] // len(grp.table_ids)
            for i, t in enumerate(grp.table_ids):
                by_table[t] = piece[:, i * d : (i + 1) * d]
        return torch.cat([by_table[t] for t in range(num_tables)], dim=1)

    def _group_forward(self, grp: _Group, indices, offsets, batch):
        n_tables = len(grp.table_ids)
        lengths_per_table = (offsets[batch::batch] - offsets[:-1:batch])[:n_tables]
        base = torch.tensor(grp.row_offsets, device=indices.device, dtype=indices.dtype)
        shifted = indices + base.repeat_interleave(lengths_per_table, output_size=indices.numel())
        pooled = FusedLookup.apply(self._placeholder, grp, shifted, offsets)
        dim = pooled.shape[1]
        return pooled.view(n_tables, batch, dim).transpose(0, 1).reshape(batch, n_tables * dim)


def _select_tables(indices, offsets, table_ids, batch):
    """The table-major indices/offsets of a subset of tables."""
    parts, lens = [], []
    for t in table_ids:
        start, end = int(offsets[t * batch]), int(offsets[(t + 1) * batch])
        parts.append(indices[start:end])
        lens.append(
            offsets[t * batch + 1 : (t + 1) * batch + 1] - offsets[t * batch : (t + 1) * batch]
        )
    new_offsets = torch.zeros(
        len(table_ids) * batch + 1, dtype=offsets.dtype, device=offsets.device
    )
    torch.cumsum(torch.cat(lens), 0, out=new_offsets[1:])
    return torch.cat(parts), new_offsets

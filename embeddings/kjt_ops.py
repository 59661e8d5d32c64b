"""Cutting and joining KeyedJaggedTensors along the batch dimension, vectorised.

FAE regroups the inputs of a window of mini-batches into hot and cold ones: "these inputs of a
KJT, every feature" and "these KJTs one after the other", without a Python loop over inputs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numba
import numpy as np
import torch

if TYPE_CHECKING:  # torchrec is imported where a KJT is built: plan and profile code needs none
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


def _kjt(**kwargs) -> KeyedJaggedTensor:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    return KeyedJaggedTensor(**kwargs)


def in_feature_order(features: KeyedJaggedTensor, names: list[str]) -> KeyedJaggedTensor:
    """`features` with its keys permuted to `names` (a no-op when they already are)."""
    if features.keys() != names:
        features = features.permute([features.keys().index(f) for f in names])
    return features


def concat_kjts(parts: list[KeyedJaggedTensor]) -> KeyedJaggedTensor:
    """KJTs joined along the batch dimension (features in the first one's key order)."""
    if len(parts) == 1:
        return parts[0]
    keys = parts[0].keys()
    T = len(keys)
    lengths, per_table = [], []
    for kjt in parts:
        kjt = in_feature_order(kjt, keys)
        ln = kjt.lengths().view(T, kjt.stride())
        lengths.append(ln)
        per_table.append(torch.split(kjt.values(), ln.sum(1).tolist()))
    values = torch.cat([pt[t] for t in range(T) for pt in per_table])
    ln = torch.cat(lengths, dim=1)
    return _kjt(keys=keys, values=values, lengths=ln.reshape(-1), stride=ln.shape[1])


class KJTSelector:
    """A KJT's per-(feature, input) lengths and starts computed once, so that cutting many
    subsets of its inputs costs only their own lookups."""

    def __init__(self, kjt: KeyedJaggedTensor) -> None:
        self.keys = kjt.keys()
        self.size, T = kjt.stride(), len(self.keys)
        self.lengths = kjt.lengths().view(T, self.size).long()
        self.starts = kjt.offsets()[:-1].view(T, self.size).long()
        self.lengths_dtype = kjt.lengths().dtype
        self.values = kjt.values()

    def select(self, idx: np.ndarray | torch.Tensor) -> KeyedJaggedTensor:
        """The inputs at positions `idx` (every feature), in that order."""
        sel = torch.as_tensor(np.ascontiguousarray(idx, dtype=np.int64))
        new_len = self.lengths[:, sel].reshape(-1)
        new_start = self.starts[:, sel].reshape(-1)
        total = int(new_len.sum())
        first = torch.zeros(new_len.numel(), dtype=torch.int64)
        first[1:] = torch.cumsum(new_len, 0)[:-1]
        pos = new_start.repeat_interleave(new_len, output_size=total) + (
            torch.arange(total) - first.repeat_interleave(new_len, output_size=total)
        )
        return _kjt(
            keys=self.keys,
            values=self.values[pos],
            lengths=new_len.to(self.lengths_dtype),
            stride=sel.numel(),
        )


def select_inputs(kjt: KeyedJaggedTensor, idx: np.ndarray | torch.Tensor) -> KeyedJaggedTensor:
    """The inputs at positions `idx` of a KJT (every feature)."""
    return KJTSelector(kjt).select(idx)


@numba.njit(cache=True)
def _bag_lengths(offsets, T, rows, idx, out_len, col0):  # pragma: no cover
    for t in range(T):
        for j in range(idx.shape[0]):
            out_len[t, col0 + j] = offsets[t * rows + idx[j] + 1] - offsets[t * rows + idx[j]]


@numba.njit(cache=True)
def _copy_bags(values, offsets, T, rows, idx, out, out_offsets, out_rows, col0):  # pragma: no cover
    for t in range(T):
        for j in range(idx.shape[0]):
            a, b = offsets[t * rows + idx[j]], offsets[t * rows + idx[j] + 1]
            o = out_offsets[t * out_rows + col0 + j]
            for k in range(b - a):
                out[o + k] = values[a + k]


def gather_rows(parts: list[tuple[KeyedJaggedTensor, np.ndarray]]) -> KeyedJaggedTensor:
    """The rows `idx` of each KJT, the parts one after the other (every feature, in the first
    part's key order), in one pass over their lookups: what `concat_kjts` of `select_inputs`
    gives, without its per-part tensor ops (Slipstream refills a mini-batch every step). CPU
    tensors without weights only; others go through those two."""
    kjts = [in_feature_order(k, parts[0][0].keys()) for k, _ in parts]
    if any(k.values().device.type != "cpu" or k.weights_or_none() is not None for k in kjts):
        return concat_kjts([select_inputs(k, i) for k, (_, i) in zip(kjts, parts)])
    T = len(kjts[0].keys())
    idxs = [np.ascontiguousarray(i, dtype=np.int64) for _, i in parts]
    offsets = [k.offsets().numpy() for k in kjts]
    out_rows = sum(i.size for i in idxs)
    out_len = np.empty((T, out_rows), dtype=offsets[0].dtype)
    col0 = 0
    for kjt, off, i in zip(kjts, offsets, idxs):
        _bag_lengths(off, T, kjt.stride(), i, out_len, col0)
        col0 += i.size
    out_offsets = np.zeros(out_len.size + 1, dtype=np.int64)
    np.cumsum(out_len.reshape(-1), out=out_offsets[1:])
    dtype = kjts[0].values().dtype
    out = torch.empty(int(out_offsets[-1]), dtype=dtype)
    col0 = 0
    for kjt, off, i in zip(kjts, offsets, idxs):
        values = kjt.values()
        if values.dtype != dtype:
            values = values.to(dtype)
        _copy_bags(values.numpy(), off, T, kjt.stride(), i, out.numpy(), out_offsets, out_rows, col0)  # fmt: skip
        col0 += i.size
    lengths_out = torch.from_numpy(out_len.reshape(-1)).to(kjts[0].lengths().dtype)
    return _kjt(keys=kjts[0].keys(), values=out, lengths=lengths_out, stride=out_rows)

"""Cutting and joining KeyedJaggedTensors along the batch dimension, vectorised.

FAE regroups the inputs of a window of mini-batches into hot and cold ones: "these inputs of a
KJT, every feature" and "these KJTs one after the other", without a Python loop over inputs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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

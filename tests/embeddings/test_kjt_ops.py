import numpy as np
import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embeddings.kjt_ops import (
    KJTSelector,
    concat_kjts,
    gather_rows,
    in_feature_order,
    select_inputs,
)


def ragged(batch: int, seed: int, keys=("a", "b", "c")) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (len(keys) * batch,), generator=g)
    values = torch.randint(0, 1000, (int(lengths.sum()),), generator=g)
    return KeyedJaggedTensor(keys=list(keys), values=values, lengths=lengths.int(), stride=batch)


def per_input(kjt: KeyedJaggedTensor) -> list[dict[str, list[int]]]:
    """Reference: each input's ids per feature, by plain Python."""
    d = kjt.to_dict()
    out = []
    for i in range(kjt.stride()):
        out.append(
            {
                k: d[k].values()[d[k].offsets()[i] : d[k].offsets()[i + 1]].tolist()
                for k in kjt.keys()
            }
        )
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_select_matches_a_per_input_reference(seed):
    kjt = ragged(9, seed)
    idx = np.array([8, 0, 3, 3, 5])
    got = select_inputs(kjt, idx)
    ref = per_input(kjt)
    assert got.stride() == 5 and per_input(got) == [ref[i] for i in idx]
    selector = KJTSelector(kjt)  # reused for several cuts
    assert per_input(selector.select(torch.tensor([1, 2]))) == ref[1:3]
    empty = selector.select(np.array([], dtype=np.int64))
    assert empty.stride() == 0 and empty.values().numel() == 0


def test_concat_joins_along_the_batch_and_follows_the_first_key_order():
    a, b = ragged(4, 3), ragged(3, 4)
    b_reordered = in_feature_order(b, ["c", "a", "b"])
    joined = concat_kjts([a, b_reordered])
    assert joined.keys() == ["a", "b", "c"] and joined.stride() == 7
    assert per_input(joined) == per_input(a) + per_input(b)
    assert concat_kjts([a]) is a


@pytest.mark.parametrize("seed", [0, 1])
def test_gather_rows_is_select_then_concat(seed):
    """Slipstream's one-pass refill: the rows of several KJTs (keys in another order, empty
    selections, repeats) against the per-input reference."""
    gen = np.random.default_rng(seed)
    parts = []
    for j, batch in enumerate((5, 1, 9)):
        kjt = ragged(batch, seed * 10 + j)
        if j == 1:
            kjt = kjt.permute([2, 0, 1])
        idx = np.sort(gen.choice(batch, size=int(gen.integers(0, batch + 1)), replace=True))
        parts.append((kjt, idx))
    got = gather_rows(parts)
    want = [per_input(in_feature_order(k, ["a", "b", "c"]))[i] for k, idx in parts for i in idx]
    assert got.keys() == ["a", "b", "c"] and got.stride() == len(want)
    assert per_input(got) == want
    assert got.lengths().dtype == parts[0][0].lengths().dtype

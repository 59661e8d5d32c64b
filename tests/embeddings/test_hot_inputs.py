import numpy as np
import torch

from embeddings.hot_inputs import all_hot_inputs, lookup_slots


def test_all_hot_inputs_matches_a_per_input_loop_on_random_jagged_batches():
    rng = np.random.default_rng(0)
    for case in range(60):
        sizes = rng.integers(1, 20, rng.integers(1, 5))
        batch = int(rng.integers(1, 9))
        hot_share = [0.0, 0.5, 0.9, 1.0][case % 4]
        remaps, off = [], 0
        for n in sizes:
            hot = np.flatnonzero(rng.random(n) < hot_share)
            r = np.full(n, -1, np.int32)
            r[hot] = np.arange(off, off + hot.size)
            off += hot.size
            remaps.append(r)
        lengths = rng.integers(0, 4, (len(sizes), batch))
        bags = [[rng.integers(0, n, k) for k in lengths[t]] for t, n in enumerate(sizes)]
        values = np.concatenate([b for per in bags for b in per] + [np.zeros(0, np.int64)])
        want = [
            all((remaps[t][bags[t][i]] >= 0).all() for t in range(len(sizes))) for i in range(batch)
        ]
        base = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        args = (torch.from_numpy(np.concatenate(remaps)), torch.from_numpy(base),
                torch.from_numpy(values.astype(np.int64)), torch.from_numpy(lengths.reshape(-1)), batch)  # fmt: skip
        assert all_hot_inputs(*args).tolist() == want, case
        slots = lookup_slots(*args)
        assert all_hot_inputs(*args, slots=slots).tolist() == want
        assert slots.tolist() == [
            int(remaps[t][v]) for t in range(len(sizes)) for b in bags[t] for v in b
        ]

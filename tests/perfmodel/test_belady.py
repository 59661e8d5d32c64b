"""Belady's MIN over mini-batches (perfmodel/belady.py): the fewest misses, checked against an
exhaustive search over every cache content, and a floor under the tier's own cache policy."""

from itertools import combinations

import numpy as np
import torch

from perfmodel.belady import min_misses
from perfmodel.row_cache_model import replay_row_cache


def exhaustive(batches: list[list[int]], capacity: int, counted_from: int = 0) -> int:
    """The optimum by brute force: a batch misses the rows the cache does not hold, then the
    cache may keep any `capacity` of what it held and the batch's rows; the fewest misses over
    every such sequence of cache contents."""
    best = {frozenset(): 0}
    for b, rows in enumerate(batches):
        nxt: dict[frozenset, int] = {}
        for state, cost in best.items():
            cost += len(set(rows) - state) if b >= counted_from else 0
            pool = sorted(state | set(rows))
            for k in range(min(capacity, len(pool)) + 1):
                for keep in combinations(pool, k):
                    s = frozenset(keep)
                    if cost < nxt.get(s, 1 << 30):
                        nxt[s] = cost
        best = nxt
    return min(best.values())


def test_the_row_used_sooner_stays():
    # capacity 1: 1, 2, 1, 2 keeps 1 over 2 (used sooner): 3 misses where LRU has 4
    batches = [torch.tensor([g]) for g in (1, 2, 1, 2)]
    assert min_misses(batches, 1) == 3
    assert min_misses(batches, 2) == 2 and min_misses(batches, 0) == 4
    assert min_misses(batches, 1, counted_from=2) == 1  # the warm-up's misses not counted


def test_min_misses_is_the_exhaustive_optimum():
    rng = np.random.default_rng(0)
    for trial in range(40):
        capacity = int(rng.integers(0, 4))
        batches = [
            sorted(set(rng.zipf(1.3, int(rng.integers(1, 4))).clip(max=8).tolist()))
            for _ in range(int(rng.integers(3, 9)))
        ]
        counted = int(rng.integers(0, 3))
        got = min_misses([torch.tensor(b) for b in batches], capacity, counted)
        assert got == exhaustive(batches, capacity, counted), (trial, batches, capacity)


def test_the_tier_policy_never_misses_fewer_than_the_bound():
    rng = np.random.default_rng(1)
    total = 5000
    batches = [torch.from_numpy(np.unique(rng.zipf(1.1, 300) % total)) for _ in range(200)]
    for capacity in (0, 100, 800, 3000):
        replay = replay_row_cache(batches, total, capacity, 63)
        bound = min_misses(batches, capacity)
        assert replay.misses >= bound, (capacity, replay.misses, bound)
    assert min_misses(batches, 3000) < replay.misses  # the policy is not optimal: room is left

"""The row cache over a run (perfmodel/row_cache_model.py): within the replayed steps it is the
cache's own code, a fresh tier reads nothing the cache never evicted, and the distinct rows of
an independent Zipf stream are extrapolated from its first steps. No timings are asserted."""

import numpy as np
import pytest
import torch

from perfmodel import row_cache_model as rcm

ROWS = 200_000
BATCH = 600
RPB = 64  # rows per 4 KiB block: 16-float rows


def zipf_stream(steps: int, seed: int = 0, a: float = 1.05) -> list[torch.Tensor]:
    """Each step's unique rows of BATCH independent Zipf draws over ROWS rows."""
    rng = np.random.default_rng(seed)
    p = np.arange(1, ROWS + 1, dtype=np.float64) ** -a
    p /= p.sum()
    perm = rng.permutation(ROWS)  # popular rows spread over the blocks, as hashed ids are
    return [torch.from_numpy(np.unique(perm[rng.choice(ROWS, BATCH, p=p)])) for _ in range(steps)]


@pytest.fixture(scope="module")
def stream():
    return zipf_stream(256)


def blocks_seconds(n: float) -> float:
    return n * 1e-4


def test_within_the_replayed_steps_the_prediction_is_the_replay(stream):
    head = stream[:48]
    for cap in (0, 500, 5000, 10**6):
        rep = rcm.replay_row_cache(head, ROWS, min(cap, ROWS), RPB)
        for fresh in (True, False):
            io = rcm.run_io(head, ROWS, ROWS, cap, RPB, None, (0, 48), blocks_seconds, fresh=fresh)
            assert io.hit_rate == pytest.approx(rep.hits / (rep.hits + rep.misses))
            assert io.misses == pytest.approx(np.mean(rep.misses_per_batch))
            reads = rep.read_blocks if fresh else rep.miss_blocks
            assert io.reads == pytest.approx(np.mean(reads))
            assert io.rmw == pytest.approx(np.mean(rep.evict_blocks))
            disk = [
                blocks_seconds(r) + 2 * blocks_seconds(e) for r, e in zip(reads, rep.evict_blocks)
            ]
            assert io.disk_s == pytest.approx(np.mean(disk))


def test_a_fresh_tier_reads_only_what_the_cache_evicted(stream):
    head = stream[:48]
    # a cache that holds every row the run touches never evicts: nothing is ever read
    big = rcm.run_io(head, ROWS, ROWS, ROWS, RPB, None, (0, 5000), blocks_seconds)
    assert big.reads == 0.0 and big.rmw == 0.0 and big.disk_s == 0.0 and big.fill_step is None
    # the same run on a tier whose every block was written before: each miss a read
    filled = rcm.run_io(head, ROWS, ROWS, ROWS, RPB, None, (0, 5000), blocks_seconds, fresh=False)
    assert filled.reads > 0 and filled.misses == pytest.approx(big.misses)
    # a small cache: no read before it first evicts, reads after
    small = rcm.run_io(head, ROWS, ROWS, 3000, RPB, None, (0, 3), blocks_seconds)
    assert small.reads == 0.0
    later = rcm.run_io(head, ROWS, ROWS, 3000, RPB, None, (30, 48), blocks_seconds)
    assert later.reads > 0 and later.rmw > 0


def test_distinct_rows_of_a_zipf_stream_extrapolate_from_its_first_steps(stream):
    new = rcm.new_rows(stream)
    counted = np.cumsum(new)
    # new_rows counts exactly
    seen = set()
    for k, ids in enumerate(stream[:20]):
        before = len(seen)
        seen.update(ids.tolist())
        assert new[k] == len(seen) - before
    U = rcm.unseen_curve(new[:48], ROWS)
    assert U(48) == pytest.approx(counted[47])
    # twice and three times the counted steps within 5%, five times within 10% (8% measured:
    # the curve bends faster as the 200k rows run out)
    for k, rel in ((96, 0.05), (160, 0.05), (256, 0.1)):
        assert U(k) == pytest.approx(counted[k - 1], rel=rel)
    assert U(10**9) <= ROWS  # never more rows than there are


def test_a_cache_that_fits_hits_more_the_longer_the_run(stream):
    head = stream[:48]
    rates = [rcm.run_io(head, ROWS, ROWS, ROWS, RPB, None, (0, end), blocks_seconds).hit_rate
             for end in (10, 48, 200, 2000)]  # fmt: skip
    assert rates == sorted(rates) and rates[-1] > rates[0] + 0.2
    # the rate the extrapolation gives over steps 48-256 against the replay of those steps
    rep = rcm.replay_row_cache(stream, ROWS, ROWS, RPB)
    want = sum(rep.hits_per_batch[48:]) / sum(rep.hits_per_batch[48:] + rep.misses_per_batch[48:])
    got = rcm.run_io(head, ROWS, ROWS, ROWS, RPB, None, (48, 256), blocks_seconds).hit_rate
    assert got == pytest.approx(want, abs=0.05)


def test_a_long_run_is_predicted_on_a_grid_and_settles_at_the_steady_rate(stream):
    head = stream[:48]
    io = rcm.run_io(head, ROWS, ROWS, 4000, RPB, None, (10**6, 10**8), blocks_seconds)
    assert io.fill_step is not None and io.fill_step < 48
    assert io.hit_rate == pytest.approx(io.steady_hit_rate, abs=1e-6)
    # long after the cache filled, the tier's blocks are all written: every miss is a read
    assert io.reads > 0.9 * rcm.run_io(head, ROWS, ROWS, 4000, RPB, None, (10**6, 10**8),
                                        blocks_seconds, fresh=False).reads  # fmt: skip
    # a cache smaller than a step's rows keeps little
    tiny = rcm.run_io(head, ROWS, ROWS, 50, RPB, None, (100, 200), blocks_seconds)
    assert tiny.steady_hit_rate < 0.05


def test_a_stream_without_cold_rows_reads_nothing():
    empty = [torch.zeros(0, dtype=torch.int64)] * 4
    for stream in ([], empty):
        io = rcm.run_io(stream, ROWS, ROWS, 100, RPB, None, (0, 1000), blocks_seconds)
        assert (io.reads, io.rmw, io.disk_s, io.misses) == (0.0, 0.0, 0.0, 0.0)


def _distinct(batches: list[torch.Tensor]) -> int:
    return int(np.unique(torch.cat(batches).numpy()).size) if batches else 0


@pytest.mark.parametrize("warm_rows", [0, 700])
@pytest.mark.parametrize("spare", [0, 1, 5000])
def test_a_cache_that_never_evicts_is_counted_as_the_cache_replays_it(stream, warm_rows, spare):
    """Where every row read fits the cache, `replay_row_cache` counts hits, misses and blocks
    with sorts: the same figures, exactly, as the cache's own code batch by batch."""
    head = stream[:48]
    rng = np.random.default_rng(1)
    warm = [torch.from_numpy(np.sort(rng.choice(ROWS, warm_rows, replace=False)))][
        : bool(warm_rows)
    ]
    cap = _distinct(head + warm) + spare  # spare 0: the cache ends exactly full
    prio = lambda g: (g % 5).long()  # noqa: E731
    assert rcm._replay_without_evictions(head, cap, RPB, warm) is not None  # the sorts count it
    counted = rcm.replay_row_cache(head, ROWS, cap, RPB, prio, warm=warm)
    assert counted == rcm._replay_policy(head, ROWS, cap, RPB, prio, warm=warm)
    assert counted.hits > 0 and counted.misses > 0


def test_a_cache_that_fills_is_replayed_by_its_own_policy(stream):
    """One row short of holding every row read: the policy evicts, so the sorts do not count."""
    head = stream[:48]
    cap = _distinct(head) - 1
    assert rcm._replay_without_evictions(head, cap, RPB) is None
    rep = rcm.replay_row_cache(head, ROWS, cap, RPB)
    assert rep == rcm._replay_policy(head, ROWS, cap, RPB) and rep.evictions > 0


def test_the_planners_priority_is_the_tiers_profile_priority():
    """`counts_priority` (the planner's, from the per-table count arrays) gives every row the
    priority the tier's `profile_priority` gives it: its count, 0 unseen, int64, same shape."""
    from embeddings.ssd.collection import profile_priority

    rng = np.random.default_rng(3)
    sizes = [7, 1000, 1, 40_000, 513]
    counts = [np.where(rng.random(n) < 0.3, rng.integers(1, 9, n), 0).astype(np.int32)
              for n in sizes]  # fmt: skip
    counts[2][:] = 0  # a table the profile never saw
    g = torch.from_numpy(rng.integers(0, sum(sizes), 20_000)).view(100, 200)
    want, got = profile_priority(counts, sizes)(g), rcm.counts_priority(counts, sizes)(g)
    assert got.dtype == want.dtype == torch.int64 and got.shape == want.shape
    assert torch.equal(got, want)
    assert rcm.counts_priority([np.zeros(3, np.int32)], [3]) is None
    assert profile_priority([np.zeros(3, np.int32)], [3]) is None


def test_new_rows_are_each_rows_first_batch(stream):
    """`new_rows` (one sort of (row, batch) keys) counts, per batch, the rows no earlier batch
    had: the same counts as each row's first occurrence by np.unique."""
    head = stream[:48] + [torch.zeros(0, dtype=torch.int64), stream[3]]
    ids = torch.cat(head).numpy()
    which = np.repeat(np.arange(len(head)), [t.numel() for t in head])
    _, first = np.unique(ids, return_index=True)
    want = np.bincount(which[first], minlength=len(head))
    assert rcm.new_rows(head).tolist() == want.tolist()
    assert rcm.new_rows(head)[-1] == 0 and rcm.new_rows([]).size == 0

"""No degenerate candidate reaches the planner's table as a contender (dlrm/placement/auto.py):
a hot set too small to spare the bytes the placement without one moves, a larger hot set that
moves no fewer bytes than a smaller one, and a candidate another beats on every predicted part
are rejected as dominated. The bytes per sample come from the profile's coverage
(dlrm/placement/enumerator.py's `Coverage`), checked here against a direct count."""

from __future__ import annotations

import numpy as np
import pytest

from dlrm.placement.auto import MIN_SAVING, _drop_degenerate, _drop_dominated
from dlrm.placement.candidates import Candidate, Prediction, StepTime, TierBytes
from dlrm.placement.enumerator import Coverage, Weighed
from embeddings import SparseOptimizer, tables_for_features
from embeddings.hot_rows import row_bytes
from embeddings.profile import AccessProfile

ROWS, DIM = 1000, 4
SGD = SparseOptimizer("sgd")
RB = row_bytes(DIM, SGD)  # 16 bytes: weights, no state


def flat_profile(seed: int = 0) -> AccessProfile:
    """Two tables of ROWS rows, every row looked up once by one of ROWS inputs (one id per table
    and input): no row is hotter than another, so a small hot set covers almost nothing."""
    rng = np.random.default_rng(seed)
    ids = [rng.permutation(ROWS), rng.permutation(ROWS)]
    return AccessProfile(["a", "b"], [ROWS, ROWS], [np.ones(ROWS, np.int64)] * 2, ROWS, 1.0,
                         np.ones((2, ROWS), np.int32), np.concatenate(ids).astype(np.int64))  # fmt: skip


def tables():
    return tables_for_features([ROWS, ROWS], DIM, ["a", "b"])


def row(c: Candidate, ms: float | None = None, **parts) -> Weighed:
    p = None if ms is None else Prediction.of(StepTime(**(parts or {"dense": ms})))
    return Weighed(c, TierBytes(host=1), p, cfg=object())


def test_coverage_is_a_direct_count_of_the_profiles_lookups():
    prof = flat_profile()
    cov = Coverage(prof, tables(), SGD)
    assert cov.plain == 2 * 2 * DIM * 4  # per table: the pooled row there, its gradient back
    # a hot set of k rows (ranked in a stable order among equal counts) covers k of ROWS lookups
    k = 300
    hot = cov.row[:k], cov.table[:k]
    assert cov.shares(k * RB).sum() == pytest.approx(k / ROWS)
    held = [set(hot[0][hot[1] == t].tolist()) for t in (0, 1)]
    ids = prof.sample_values.reshape(2, ROWS)
    direct = np.mean([ids[0, i] in held[0] and ids[1, i] in held[1] for i in range(ROWS)])
    assert cov.all_hot(k * RB) == pytest.approx(direct)
    assert cov.replicated(k * RB) == pytest.approx((1 - direct) * cov.plain)
    cold = 2 - k / ROWS  # cold lookups per sample, both tables
    assert cov.staged(k * RB) == pytest.approx(2 * cold * RB)
    assert cov.all_hot(2 * ROWS * RB) == 1.0 and cov.staged(2 * ROWS * RB) == 0.0


def test_a_hot_set_that_covers_almost_no_lookup_is_dominated_by_the_plain_placement():
    cov = Coverage(flat_profile(), tables(), SGD)
    host = row(Candidate("host"))
    tiny_fae, big_fae = row(Candidate("fae", 2 * RB)), row(Candidate("fae", 1900 * RB))
    tiny_hotline = row(Candidate("hotline", 2 * RB))
    kept = _drop_degenerate([host, tiny_fae, big_fae, tiny_hotline], cov)
    assert kept == [host, big_fae]
    assert tiny_fae.moved > cov.plain * (1 - MIN_SAVING) and big_fae.moved < cov.plain / 2
    for w in (tiny_fae, tiny_hotline):
        assert w.rejected.startswith("dominated by host: its hot set moves ")
    assert host.moved == cov.plain and host.rejected is None


def test_a_larger_hot_set_that_moves_no_fewer_bytes_is_dominated_by_the_smaller():
    # every row hot at 2 * ROWS rows: a larger budget than that holds nothing more
    cov = Coverage(flat_profile(), tables(), SGD)
    whole, larger = row(Candidate("fae", 2 * ROWS * RB)), row(Candidate("fae", 4 * ROWS * RB))
    assert _drop_degenerate([larger, whole], cov) == [whole]
    assert larger.rejected == (
        f"dominated by {whole.candidate.label()}: no fewer bytes per sample with a larger hot set"
    )


def test_a_candidate_beaten_on_every_predicted_part_is_dominated():
    a = row(Candidate("hotline", 4096), 3.0, dense=1.0, staging=2.0)
    b = row(Candidate("hotline", 8192), 2.5, dense=1.0, staging=1.5)  # beats a on every part
    c = row(Candidate("fae", 4096), 2.0, dense=0.5, lookup=1.5)  # a trade: not dominated by b
    assert _drop_dominated([a, b, c]) == [b, c]
    assert a.rejected == f"dominated by {b.candidate.label()} on every predicted part"
    # equal predictions dominate nothing: the tie-break decides between them
    d, e = row(Candidate("fae", 1024), 2.0), row(Candidate("host"), 2.0)
    assert _drop_dominated([d, e]) == [d, e]

"""The SSD tier's write-back log (embeddings/ssd/log.py): evicted rows appended and swept home
return exactly what was written, through sweeps, a full ring, flushes, checkpoints and restores;
a sweep patches many rows into each block it writes; a damaged log block is refused."""

import numpy as np
import pytest
import torch

from embeddings.config import SparseOptimizer, TableSpec
from embeddings.errors import ScmError
from embeddings.row_init import hashed_rows
from embeddings.ssd.file import BLOCK
from embeddings.ssd.log import BYTES_PER_ROW, LOG, MIN_SLICE, patch_share, split_cache
from embeddings.ssd.tier import ScmTier

DIM = 4  # rows of 4 floats (SGD): 254 to a block, so a sweep can share blocks between rows
TABLES = [TableSpec("t0", 30_000, DIM, "f0"), TableSpec("t1", 50_000, DIM, "f1")]
TOTAL = 80_000
OPT = SparseOptimizer("sgd", 0.1)


def tier(path, log_rows=3000, cache_rows=3000, io="buffered", resume=False):
    """A tier whose log holds `log_rows` live rows and whose cache holds `cache_rows`."""
    total = log_rows * BYTES_PER_ROW + cache_rows * 4 * DIM
    t = ScmTier(path, TABLES, OPT, 5, total, io=io, io_threads=4, io_depth=8, resume=resume,
                log_rows=log_rows)  # fmt: skip
    assert (t.cache.capacity, t.log_rows) == (cache_rows, log_rows)
    t.log.min_slice = 64  # slices small beside the log, as at real sizes
    return t


def initial(ids: torch.Tensor) -> torch.Tensor:
    out = torch.empty(ids.numel(), DIM)
    first = ids < 30_000
    out[first] = hashed_rows(ids[first], DIM, 0, 30_000, 5)
    out[~first] = hashed_rows(ids[~first] - 30_000, DIM, 1, 50_000, 5)
    return out


def train_like(t, steps, seed, truth, batch=900):
    """Mini-batches of random unique rows: read, then written back changed, as a step does;
    every read checked against `truth` (the rows as last written)."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        ids = torch.unique(torch.randint(0, TOTAL, (batch,), generator=g))
        w, _ = t.read_rows(ids)
        assert torch.equal(w, truth[ids])
        new = w + torch.randn(w.shape, generator=g)
        truth[ids] = new
        t.write_rows(ids, new, None, given=True)


@pytest.mark.parametrize("io", ["buffered", "direct"])
def test_rows_through_the_log_and_its_sweeps_read_back_exactly(tmp_path, io):
    t = tier(tmp_path / "scm", io=io)
    truth = initial(torch.arange(TOTAL))
    train_like(t, 60, 0, truth)
    c = t.counters()
    assert c["scm_log_rows_written"] > 6000 and c["scm_log_sweeps"] >= 2
    assert c["scm_log_rows_swept"] > 0 and c["scm_log_rows_read"] > 0  # misses found in the log
    assert c["scm_rows_written"] == c["scm_log_rows_swept"]  # home writes came from sweeps only
    with t._locked():
        pass
    every = torch.arange(TOTAL)
    assert torch.equal(t.split_rows(t.peek_rows(every))[0], truth)
    t.flush()
    assert t.log.logged == 0 and not bool(t.cache.dirty.any())
    assert torch.equal(t.split_rows(t._read_home(every, count=False))[0], truth)  # all home now
    train_like(t, 10, 1, truth)  # and the log goes on after a flush
    assert torch.equal(t.split_rows(t.peek_rows(every))[0], truth)


def test_a_sweep_patches_many_rows_into_each_block_it_writes(tmp_path):
    """The point of the log: without it every evicted row is a block read and written; a sweep
    writes each block once for all of its logged rows."""
    counts = {}
    for name, log_rows in (("log", 10_000), ("none", 0)):
        total = log_rows * BYTES_PER_ROW + 10_000 * 4 * DIM
        t = ScmTier(tmp_path / name, TABLES, OPT, 5, total, io="buffered", io_threads=4,
                    log_rows=log_rows)  # fmt: skip
        truth = initial(torch.arange(TOTAL))
        train_like(t, 80, 3, truth)
        t.flush()
        assert torch.equal(t.split_rows(t.peek_rows(torch.arange(TOTAL)))[0], truth)
        counts[name] = t.counters()
        t.close()
    log, none = counts["log"], counts["none"]

    def rows_per_block(c):
        return c["scm_rows_written"] / (c["scm_writeback_bytes"] / BLOCK)

    assert none["scm_log_rows"] == 0 and log["scm_log_rows"] == 10_000
    assert log["scm_log_rows_swept"] > 10_000 and log["scm_log_sweeps"] >= 1
    # without the log a block is patched for the few rows of one eviction that share it
    assert rows_per_block(none) < 5, rows_per_block(none)
    assert rows_per_block(log) > 5 * rows_per_block(none), (
        rows_per_block(log),
        rows_per_block(none),
    )
    assert log["scm_log_blocks_written"] * 254 >= log["scm_log_rows_written"]
    # the planner's figure for it (blocks patched per evicted row, uniform rows) is of its order
    predicted = patch_share(10_000, TOTAL, 254) - 1 / 254
    measured = (log["scm_writeback_bytes"] / BLOCK) / log["scm_rows_written"]
    assert predicted / 2 < measured < predicted * 2, (measured, predicted)


def test_a_full_ring_ends_the_sweep_at_once_and_loses_nothing(tmp_path):
    """A sweep that moves too slowly for the appends (16 rows a slice here) is finished by the
    append that finds the ring full, before it writes."""
    t = tier(tmp_path / "scm", log_rows=8 * 254, cache_rows=2100)
    t.log.min_slice, t.log.slice_factor = 16, 0
    truth = initial(torch.arange(TOTAL))
    train_like(t, 30, 4, truth, batch=2500)
    c = t.counters()
    assert c["scm_log_sweeps"] >= 5 and c["scm_log_rows_swept"] > 0
    assert t.log.counts["full_ring_waits"] >= 5
    assert torch.equal(t.split_rows(t.peek_rows(torch.arange(TOTAL)))[0], truth)


def test_a_checkpoint_holds_the_home_blocks_alone_and_a_restore_starts_the_log_empty(tmp_path):
    t = tier(tmp_path / "scm")
    truth = initial(torch.arange(TOTAL))
    train_like(t, 30, 5, truth)
    assert t.log.logged > 0
    gen = t.prepare()  # the checkpoint's point: everything home
    assert t.log.logged == 0
    materialised, tid = t.materialised.copy(), t.tier_id
    t.commit(gen)
    at_checkpoint = truth.clone()
    train_like(t, 30, 6, truth)  # rows logged and swept after the checkpoint
    assert t.log.logged > 0 and t.counters()["scm_log_sweeps"] >= 1
    t.close()
    # a resumed process: the home blocks rolled back, the log of the lost steps not used
    r = tier(tmp_path / "scm", resume=True)
    r.restore(gen, tid, materialised)
    assert r.log.logged == 0
    assert torch.equal(r.split_rows(r.peek_rows(torch.arange(TOTAL)))[0], at_checkpoint)
    train_like(r, 5, 7, at_checkpoint)


def test_a_damaged_log_block_is_refused_naming_the_log(tmp_path):
    t = tier(tmp_path / "scm", log_rows=10_000, cache_rows=10_000)
    truth = initial(torch.arange(TOTAL))
    train_like(t, 12, 8, truth)
    with t._locked():  # the queued writes stored
        pass
    t.writes.forget()  # and none served from the last few writes
    gids, slots = t.log.map.items()
    assert gids.size
    block = int(slots[0] % t.log.ring_rows // t.rpb)
    with open(tmp_path / "scm" / LOG, "r+b") as f:
        f.seek(block * BLOCK + 100)
        f.write(b"\x55" * 8)
    t.cache.map.clear()  # the row is not served from DRAM: it must come from the log
    t.cache.gid[:] = -1
    with pytest.raises(ScmError, match=rf"{LOG}: block {block} .*checksum"):
        t.read_rows(torch.from_numpy(gids[:1]))


def test_a_log_file_in_a_directory_without_a_tier_is_refused_untouched(tmp_path):
    """`--scm-dir` naming a directory that holds a log.dat but no tier.json (a user's file of
    that name, or a tier whose description was lost): never truncated to start a log."""
    d = tmp_path / "scm"
    d.mkdir()
    (d / LOG).write_bytes(b"someone's log")
    with pytest.raises(ScmError, match=rf"holds {LOG} but no tier.json"):
        tier(d)
    assert (d / LOG).read_bytes() == b"someone's log"


def test_a_tier_file_that_is_a_link_is_refused_and_its_target_untouched(tmp_path):
    """A log.dat (or rows.dat) replaced by a link to another file: opening the tier would
    truncate the link's target; it is refused instead."""
    t = tier(tmp_path / "scm")
    t.prepare()
    gen, tid, mat = t.generation, t.tier_id, t.materialised.copy()
    t.close()
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    (tmp_path / "scm" / LOG).unlink()
    (tmp_path / "scm" / LOG).symlink_to(victim)
    with pytest.raises(ScmError, match=rf"{LOG}: a symbolic link"):
        tier(tmp_path / "scm", resume=True)
    assert victim.read_text() == "keep me"
    assert gen and tid and mat is not None


def test_the_log_takes_its_map_out_of_the_cache_bytes_and_a_small_one_is_none():
    rows = 10**7  # 159k blocks of 63: the log's 310k rows are more than a quarter of them
    cache, live = split_cache(64 << 20, 64, 63, 0.25, rows)
    assert live == (16 << 20) // BYTES_PER_ROW
    assert cache == ((64 << 20) - live * BYTES_PER_ROW) // 64
    assert split_cache(64 << 20, 64, 63, 0.0, rows) == ((64 << 20) // 64, 0)
    assert split_cache(100 * BYTES_PER_ROW, 64, 63, 0.5, rows)[1] == 0  # fewer than 2 blocks
    assert split_cache(64 << 20, 64, 63, 0.25, 1000) == (1000, 0)  # every row cached: no log
    assert split_cache(64 << 20, 1024, 3, 0.25, 10**9)[1] == 0  # a sweep: one row a block
    assert split_cache(64 << 20, 4096, 1, 0.9, 40_000)[1] == 0  # a row a block: never pays
    cache, live = split_cache(64 << 20, 64, 63, 0.9, rows)
    assert live == (64 << 20) // (64 + BYTES_PER_ROW) <= cache  # never more than the cache
    assert MIN_SLICE > 0 and np.isfinite(BYTES_PER_ROW)


def test_the_planners_share_of_patched_blocks():
    assert patch_share(0, 10**6, 63) == 1.0  # no log: one block per evicted row
    shares = [patch_share(live, 33_800_000, 63) for live in (100_000, 300_000, 1_200_000)]
    assert shares == sorted(shares, reverse=True)  # a larger log patches fewer blocks a row
    assert 1 / 63 < shares[-1] < shares[0] <= 1.0
    # a sweep of as many rows as the file has blocks patches 1 - 1/e of them
    assert abs(patch_share(536_000, 536_000 * 63, 63) - (1 - np.exp(-1) + 1 / 63)) < 1e-3

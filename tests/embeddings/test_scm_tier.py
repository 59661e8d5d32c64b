"""The SSD tier's row store: round trips through the row cache and the file, initial values,
sparse files, checksums, the undo journal, and the caches' policies."""

import os
import sys
import threading

import numpy as np
import pytest
import torch

from embeddings.config import SparseOptimizer, TableSpec
from embeddings.errors import ScmError
from embeddings.fused import FusedEmbeddingBagCollection
from embeddings.row_init import hashed_init_, hashed_rows, hashed_table
from embeddings.ssd.cache import BlockCache, RowCache, SlotMap
from embeddings.ssd.file import BLOCK, SWITCH_INTERVAL_S
from embeddings.ssd.journal import UndoJournal
from embeddings.ssd.tier import JOURNAL, ROWS, ScmTier
from embeddings.ssd.writes import RECENT

TABLES = [TableSpec("t0", 300, 8, "f0"), TableSpec("t1", 2000, 8, "f1")]


def tier(path, opt="adagrad", cache_rows=64, io="buffered", resume=False, tables=TABLES, engine="auto"):  # fmt: skip
    o = SparseOptimizer(opt, 0.1)
    row_bytes = 4 * (8 + o.state_floats(8))
    return ScmTier(
        path, tables, o, 5, cache_rows * row_bytes, io=io, io_threads=4, resume=resume,
        io_engine=engine, io_depth=8,
    )  # fmt: skip


# the file's two engines: Linux AIO (direct I/O only) and the thread pool
ENGINES = [("direct", "aio"), ("direct", "threads"), ("buffered", "threads")]


def random_rows(n, opt="adagrad", seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, 8, generator=g)
    s = {"sgd": None, "adagrad": torch.rand(n, 8, generator=g), "rowwise_adagrad": torch.rand(n, generator=g)}[opt]  # fmt: skip
    return w, s


@pytest.mark.parametrize("opt", ["sgd", "adagrad", "rowwise_adagrad"])
@pytest.mark.parametrize("io,engine", ENGINES)
def test_rows_round_trip_through_a_cache_smaller_than_them(tmp_path, opt, io, engine):
    t = tier(tmp_path / "scm", opt, cache_rows=50, io=io, engine=engine)
    assert t.file.engine == engine
    ids = torch.randperm(2300, generator=torch.Generator().manual_seed(1))[:700]
    w, s = random_rows(700, opt)
    for a in range(0, 700, 100):  # in mini-batch-sized pieces: the cache evicts as it goes
        t.read_rows(ids[a : a + 100])
        t.write_rows(ids[a : a + 100], w[a : a + 100], None if s is None else s[a : a + 100])
    got_w, got_s = t.read_rows(ids)
    assert torch.equal(got_w, w)
    assert (got_s is None) if s is None else torch.equal(got_s, s)
    c = t.counters()
    assert c["scm_cache_evictions"] > 0 and c["scm_rows_written"] > 0
    assert c["scm_bytes_read"] == c["scm_read_amplification"] * c["scm_rows_read"] * t.row_bytes or (
        abs(c["scm_bytes_read"] / (c["scm_rows_read"] * t.row_bytes) - c["scm_read_amplification"]) < 0.01
    )  # fmt: skip
    untouched = torch.tensor([i for i in range(2300) if i not in set(ids.tolist())][:20])
    w0, s0 = t.read_rows(untouched)  # never written: initial values, zero state
    assert torch.equal(w0[untouched < 300], hashed_rows(untouched[untouched < 300], 8, 0, 300, 5))
    assert torch.equal(
        w0[untouched >= 300], hashed_rows(untouched[untouched >= 300] - 300, 8, 1, 2000, 5)
    )
    assert s0 is None or not s0.any()


def test_hashed_initialisation_is_a_pure_function_with_the_reference_bounds():
    full = hashed_table(2000, 8, 1, 5)
    rows = np.array([1999, 0, 77])
    assert torch.equal(hashed_rows(rows, 8, 1, 2000, 5), full[rows])
    bound = (1 / 2000) ** 0.5
    assert full.abs().max() <= bound and full.min() < -0.9 * bound and full.max() > 0.9 * bound
    assert abs(float(full.mean())) < 0.05 * bound
    assert not torch.equal(hashed_rows(rows, 8, 1, 2000, 6), full[rows])  # the seed matters
    assert not torch.equal(hashed_rows(rows, 8, 2, 2000, 5), full[rows])  # and the table
    coll = FusedEmbeddingBagCollection(TABLES, SparseOptimizer("sgd"), "cpu", "torch", init=False)
    hashed_init_(coll.table_weights(), 5)
    assert torch.equal(coll.table_weights()[1], full)


def test_a_table_larger_than_the_disk_stores_only_the_rows_written(tmp_path):
    big = [TableSpec("huge", 50_000_000, 8, "f0")]  # 3.2 GB logical with Adagrad state
    t = tier(tmp_path / "scm", tables=big, cache_rows=0)
    ids = torch.tensor([3, 10_000_000, 49_999_999])
    t.write_rows(ids, *random_rows(3))
    t.flush()  # the queued write stored
    size = os.path.getsize(tmp_path / "scm" / ROWS)
    assert size == t.num_blocks * BLOCK > 3e9
    assert t.counters()["scm_disk_bytes"] <= 3 * BLOCK * 4  # a few blocks (file-system rounding)
    assert torch.equal(t.read_rows(ids)[0], random_rows(3)[0])


@pytest.mark.parametrize("io,engine", ENGINES)
def test_a_damaged_block_is_named_with_its_offset_and_expected_checksum(tmp_path, io, engine):
    t = tier(tmp_path / "scm", cache_rows=0, io=io, engine=engine)
    t.write_rows(torch.tensor([400]), *random_rows(1))
    for i in range(RECENT):  # writes of other rows: row 400 is read from the file again
        t.write_rows(torch.tensor([1000 + 100 * i]), *random_rows(1))
    t.flush()  # writes are queued for the tier's next holder
    block = 400 // t.rpb
    with open(tmp_path / "scm" / ROWS, "r+b") as f:
        f.seek(block * BLOCK + 100)
        f.write(b"\x01")
    with pytest.raises(ScmError, match=rf"rows.dat: block {block} at offset {block * BLOCK}: checksum [0-9a-f]{{8}}, expected [0-9a-f]{{8}}"):  # fmt: skip
        t.read_rows(torch.tensor([400]))
    with open(tmp_path / "scm" / ROWS, "r+b") as f:  # a written block zeroed
        f.seek(block * BLOCK)
        f.write(bytes(BLOCK))
    with pytest.raises(ScmError, match=r"not a written block \(magic 0x00000000"):
        t.read_rows(torch.tensor([400]))


@pytest.mark.parametrize("io,engine", ENGINES)
def test_a_tier_file_cut_short_while_open_is_a_short_read_not_numbers(tmp_path, io, engine):
    t = tier(tmp_path / "scm", cache_rows=0, io=io, engine=engine)
    ids = torch.arange(1500, 2300, 3)  # many blocks, read as runs, more than the AIO depth
    t.write_rows(ids, *random_rows(ids.numel()))
    for i in range(RECENT):
        t.write_rows(torch.tensor([1 + 9 * i]), *random_rows(1))
    t.flush()
    assert torch.equal(t.read_rows(ids)[0], random_rows(ids.numel())[0])
    t.cache.capacity = 0  # read the file again
    os.truncate(tmp_path / "scm" / ROWS, (1500 // t.rpb + 2) * BLOCK)
    with pytest.raises(ScmError, match=r"rows.dat: short read at offset \d+: \d+ bytes, expected \d+ \(a truncated tier file\)"):  # fmt: skip
        t.read_rows(ids)


def test_the_aio_engine_needs_direct_io(tmp_path):
    with pytest.raises(ScmError, match="--scm-io-engine aio needs --scm-io direct"):
        tier(tmp_path / "scm", io="buffered", engine="aio")
    with pytest.raises(ScmError, match="--scm-io-engine: expected one of auto, aio, threads"):
        tier(tmp_path / "scm", engine="io_uring")


def test_a_truncated_tier_file_is_refused_when_opened(tmp_path):
    t = tier(tmp_path / "scm")
    t.write_rows(torch.tensor([1]), *random_rows(1))
    g = t.prepare()
    t.close()
    os.truncate(tmp_path / "scm" / ROWS, BLOCK * 3)
    with pytest.raises(
        ScmError, match=r"rows.dat: truncated or resized tier file: 12288 bytes, expected \d+"
    ):
        tier(tmp_path / "scm", resume=True)
    assert g == 1


def test_the_journal_rolls_the_file_back_to_the_base_or_a_prepared_point(tmp_path):
    t = tier(tmp_path / "scm", cache_rows=16)
    ids = torch.arange(0, 2300, 7)
    w1, s1 = random_rows(ids.numel(), seed=1)
    t.write_rows(ids, w1, s1)
    g1 = t.prepare()  # generation 1: w1; its checkpoint is "written"
    t.commit(g1)
    map1 = t.materialised.copy()
    w2, s2 = random_rows(ids.numel(), seed=2)
    t.write_rows(ids, w2, s2)
    g2 = t.prepare()  # generation 2 prepared, its checkpoint never committed
    map2 = t.materialised.copy()
    t.write_rows(ids[:50], *random_rows(50, seed=3))  # a kill mid-interval: partly written
    t.flush()
    tier_id = t.tier_id
    t.close()
    for g, m, w, s in [(g2, map2, w2, s2), (g1, map1, w1, s1)]:
        back = tier(tmp_path / "scm", resume=True)
        back.restore(g, tier_id, m)
        got_w, got_s = back.read_rows(ids)
        assert torch.equal(got_w, w) and torch.equal(got_s, s), g
        back.close()
        if g == g2:  # restoring g2 made it the base: g1 is no longer reachable
            back = tier(tmp_path / "scm", resume=True)
            with pytest.raises(ScmError, match="can be rolled back to generation 2, not 1"):
                back.restore(g1, tier_id, map1)
            back.close()
            return


def test_a_torn_journal_tail_is_ignored_but_damage_inside_is_not(tmp_path):
    j = UndoJournal(tmp_path / JOURNAL)
    j.start(b"x" * 16, 3)
    images = np.arange(3 * BLOCK, dtype=np.uint64).astype(np.uint8).reshape(3, BLOCK)
    j.add_preimages(np.array([5, 9, 2]), images)
    j.prepare(4)
    j.add_preimages(np.array([7]), images[:1])
    j.close()
    blocks, got = j.rollback_images(3)
    assert blocks.tolist() == [7, 2, 9, 5] and np.array_equal(got[3], images[0])
    assert j.rollback_images(4)[0].tolist() == [7]
    raw = (tmp_path / JOURNAL).read_bytes()
    (tmp_path / JOURNAL).write_bytes(raw[:-100])  # the last record cut by a kill
    assert j.rollback_images(3)[0].tolist() == [2, 9, 5]
    damaged = bytearray(raw)
    damaged[60 + BLOCK // 2] ^= 0xFF  # inside the first pre-image
    (tmp_path / JOURNAL).write_bytes(bytes(damaged))
    with pytest.raises(ScmError, match=r"journal.log: journal record at offset 36 is damaged"):
        j.rollback_images(3)


def test_the_row_cache_keeps_profiled_rows_and_evicts_the_least_recent_others():
    counts = torch.zeros(1000, dtype=torch.int64)
    counts[:10] = 100  # the profile's warm rows
    cache = RowCache(1000, 0, 48, priority=lambda g: counts[g])
    for step in range(40):
        cache.next_access()
        ids = torch.cat([torch.arange(10), torch.arange(100 + 8 * step, 108 + 8 * step)])
        slots = cache.lookup(ids)
        miss = ids[slots < 0]
        cache.admit(miss, dirty=False)
    assert (cache.slots(torch.arange(10)) >= 0).all()  # warm rows never left
    recent = torch.arange(100 + 8 * 38, 100 + 8 * 40)
    assert (cache.slots(recent) >= 0).all()
    assert cache.evictions > 0 and cache.hits >= 39 * 10


def test_the_row_cache_hits_more_than_a_block_cache_of_the_same_bytes():
    rng = np.random.default_rng(0)
    n, rpb, cache_bytes, row_bytes = 200_000, 32, 256 * 1024, 128
    p = 1.0 / np.arange(1, n + 1) ** 1.05
    perm = rng.permutation(n)  # popular rows scattered over the blocks, as hashed ids are
    rows = RowCache(n, 0, cache_bytes // row_bytes)
    blocks = BlockCache(cache_bytes // BLOCK)
    for _ in range(60):
        ids = np.unique(perm[rng.choice(n, 2000, p=p / p.sum())])
        rows.next_access()
        g = torch.from_numpy(ids)
        rows.admit(g[rows.lookup(g) < 0], dirty=False)
        blocks.access(ids, rpb)
    row_rate = rows.hits / (rows.hits + rows.misses)
    block_rate = blocks.row_hits / (blocks.row_hits + blocks.row_misses)
    assert row_rate > block_rate + 0.1


def test_a_write_finding_the_tier_busy_returns_at_once_and_every_later_read_sees_it(tmp_path):
    t = tier(tmp_path / "scm", cache_rows=8)
    held, release, waited = threading.Event(), threading.Event(), []

    def prefetch():  # stands for a staging's reads and evictions on the Hotline worker
        with t._locked():
            held.set()
            waited.append(not release.wait(10))

    worker = threading.Thread(target=prefetch)
    worker.start()
    held.wait(10)
    ids = torch.arange(0, 2000, 100)
    w, s = random_rows(ids.numel())
    t.write_rows(ids, w, s)  # queued: it does not wait for the worker
    got_w, got_s = t.read_rows(ids[:3])  # the last writes, read without the tier
    release.set()
    worker.join()
    assert waited == [False]
    assert torch.equal(got_w, w[:3]) and torch.equal(got_s, s[:3])
    for i in range(RECENT):  # other rows written: `ids` come from the cache and the file again
        t.write_rows(torch.tensor([2001 + i]), *random_rows(1))
    got_w, got_s = t.read_rows(ids)
    assert torch.equal(got_w, w) and torch.equal(got_s, s)
    c = t.counters()
    assert c["scm_rows_from_recent_writes"] == 3 and c["scm_rows_written"] > 0  # 20 rows, 8 slots


def test_the_switch_interval_is_lowered_only_while_io_threads_read(tmp_path, monkeypatch):
    before = sys.getswitchinterval()
    t = tier(tmp_path / "scm", cache_rows=0)
    t.write_rows(torch.arange(0, 2300, 9), *random_rows(256))
    t.flush()
    seen, real = [], os.preadv

    def preadv(*args):
        if threading.current_thread().name.startswith("scm-io"):
            seen.append(sys.getswitchinterval())
        return real(*args)

    monkeypatch.setattr(os, "preadv", preadv)
    for i in range(RECENT):
        t.write_rows(torch.tensor([1 + 9 * i]), *random_rows(1))
    t.read_rows(torch.arange(0, 2300, 9))  # blocks on several I/O threads
    assert seen and max(abs(x - min(before, SWITCH_INTERVAL_S)) for x in seen) < 1e-9
    assert sys.getswitchinterval() == before
    t.close()
    assert sys.getswitchinterval() == before


@pytest.mark.parametrize("capacity,id_range,rounds", [(1000, 10**9, 30), (40, 120, 300)])
def test_the_slot_map_agrees_with_a_dictionary_through_adds_and_removes(capacity, id_range, rounds):
    """Sparse ids, and a small table of clustered ids (long probe chains that wrap around the
    table's end, so deletions must move entries back)."""
    rng = np.random.default_rng(3)
    m, ref = SlotMap(capacity), {}
    for _ in range(rounds):
        room = capacity - len(ref)
        new = np.setdiff1d(rng.integers(0, id_range, min(50, room)), list(ref))
        new = rng.permutation(np.unique(new))  # unordered, as admissions come
        slots = rng.integers(0, 10**6, new.size)
        m.add(torch.from_numpy(new), torch.from_numpy(slots))
        ref.update(zip(new.tolist(), slots.tolist()))
        gone = rng.choice(list(ref), min(20, len(ref)), replace=False)
        m.remove(torch.from_numpy(gone))
        for g in gone.tolist():
            del ref[g]
        probe = np.concatenate([rng.choice(list(ref), 30), gone, rng.integers(0, id_range, 5)])
        got = m.get(torch.from_numpy(probe)).tolist()
        assert got == [ref.get(g, -1) for g in probe.tolist()]
    assert int((m.keys >= 0).sum()) == len(ref)


def test_recent_writes_skip_a_write_of_no_rows():
    from embeddings.ssd.writes import WriteQueue

    q = WriteQueue(row_floats=2)
    q.put(torch.tensor([3, 7]), (torch.tensor([[1.0, 2.0], [3.0, 4.0]]),))
    q.put(torch.empty(0, dtype=torch.long), (torch.empty(0, 2),))  # a step without cold rows
    assert torch.equal(q.recent(torch.tensor([7, 3])), torch.tensor([[3.0, 4.0], [1.0, 2.0]]))
    assert q.recent(torch.tensor([5])) is None


def test_a_write_given_in_parts_reads_back_joined_and_unsorted_ids_in_order():
    """A step's write-back is queued as its weights and state apart (no copy on its thread):
    a read served from the recent writes joins them, whatever order the ids came in."""
    from embeddings.ssd.writes import WriteQueue

    q = WriteQueue(row_floats=3)
    w, st = torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[5.0], [6.0]])
    q.put(torch.tensor([7, 3]), (w, st))
    assert torch.equal(
        q.recent(torch.tensor([3, 7])), torch.tensor([[3.0, 4.0, 6.0], [1.0, 2.0, 5.0]])
    )
    assert q.take()[0][1] == (w, st)  # queued as given: the storer joins them


def test_writes_of_many_blocks_go_in_pieces_with_the_same_result(tmp_path, monkeypatch):
    # a batch of evictions is written WRITE_BLOCKS blocks at a time (a bounded transient):
    # the same rows, blocks and counts as one write of them all
    import embeddings.ssd.tier

    ids = torch.randperm(2300, generator=torch.Generator().manual_seed(4))[:900]
    w, s = random_rows(900, "adagrad", seed=4)
    results = []
    for pieces, blocks in (("one", 10**6), ("pieces", 3)):
        monkeypatch.setattr(embeddings.ssd.tier, "WRITE_BLOCKS", blocks)
        t = tier(tmp_path / pieces, "adagrad", cache_rows=40)
        for a in range(0, 900, 300):  # each write evicts rows of many blocks
            t.write_rows(ids[a : a + 300], w[a : a + 300], s[a : a + 300])
        t.flush()
        got = t.read_rows(torch.arange(2300))
        c = t.counters()
        results.append((got, c["scm_rows_written"], c["scm_writeback_bytes"]))
        assert torch.equal(got[0][ids], w) and torch.equal(got[1][ids], s)
        assert c["scm_writeback_bytes"] > 3 * BLOCK
    (a, *ca), (b, *cb) = results
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and ca == cb


# --- issue 37: a tier's files are its own, whole, and used by one process ----------------------


def _killed_mid_interval(path):
    """A tier checkpointed at generation 1, then overwritten in place (pre-images journaled) and
    left as a kill -9 leaves it. Returns what restoring generation 1 needs, and its rows."""
    t = tier(path, cache_rows=0)
    ids = torch.arange(0, 2300, 5)
    w1, s1 = random_rows(ids.numel(), seed=1)
    t.write_rows(ids, w1, s1)
    g1 = t.prepare()
    t.commit(g1)
    m1 = t.materialised.copy()
    t.write_rows(ids, *random_rows(ids.numel(), seed=2))  # every block overwritten
    t.flush()
    t.close()
    return (g1, t.tier_id, m1), ids, w1, s1


@pytest.mark.parametrize("cut", ["at a record boundary", "mid-record", "to its header"])
def test_a_journal_cut_short_is_refused_naming_it_never_used(tmp_path, cut):
    # item 1: the rollback would miss the lost pre-images; the blocks they guarded still carry
    # the killed era's writes and are refused when read, the journal named
    point, ids, w1, s1 = _killed_mid_interval(tmp_path / "scm")
    path = tmp_path / "scm" / JOURNAL
    raw = path.read_bytes()
    record = 16 + BLOCK + 4
    keep = {"at a record boundary": 36 + 3 * record, "mid-record": 36 + 3 * record + 100,
            "to its header": 36}[cut]  # fmt: skip
    assert len(raw) > keep + record  # more pre-images were there
    path.write_bytes(raw[:keep])
    back = tier(tmp_path / "scm", resume=True)
    with pytest.raises(ScmError, match=r"journal.log: the journal was cut short or replaced"):
        back.restore(*point)
        back.read_rows(ids)
    back.close()


def test_an_intact_journal_still_rolls_back_exactly(tmp_path):
    point, ids, w1, s1 = _killed_mid_interval(tmp_path / "scm")
    back = tier(tmp_path / "scm", resume=True)
    back.restore(*point)
    w, s = back.read_rows(ids)
    assert torch.equal(w, w1) and torch.equal(s, s1)
    back.write_rows(ids[:10], *random_rows(10, seed=4))  # the new era's own writes read back
    back.flush()
    back.cache.__init__(back.total_rows, back.row_floats, 0)
    assert torch.equal(back.read_rows(ids[:10])[0], random_rows(10, seed=4)[0])
    back.close()


def test_another_tiers_rows_file_of_the_same_layout_is_refused(tmp_path):
    # item 2: a rows.dat copied from another run (same tables, same layout)
    points = {}
    for name, seed in [("mine", 1), ("other", 2)]:  # two finished runs: nothing to roll back
        t = tier(tmp_path / name, cache_rows=0)
        t.write_rows(torch.arange(0, 2300, 5), *random_rows(460, seed=seed))
        g = t.prepare()
        t.commit(g)
        points[name] = (g, t.tier_id, t.materialised.copy())
        t.close()
    point = points["mine"]
    (tmp_path / "mine" / ROWS).write_bytes((tmp_path / "other" / ROWS).read_bytes())
    back = tier(tmp_path / "mine", resume=True)
    with pytest.raises(
        ScmError, match=r"rows.dat: block \d+ at offset \d+ belongs to another tier"
    ):
        back.restore(*point)
    back.close()


def _digests(d):
    import hashlib

    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in d.iterdir() if p.is_file()}


@pytest.mark.parametrize("resume", [True, False])
def test_tier_files_without_their_description_are_refused_untouched(tmp_path, resume):
    # item 10: tier.json lost; the rows and the journal are not started afresh over
    _killed_mid_interval(tmp_path / "scm")
    (tmp_path / "scm" / "tier.json").unlink()
    before = _digests(tmp_path / "scm")
    with pytest.raises(ScmError, match=r"holds rows.dat and journal.log but no tier.json"):
        tier(tmp_path / "scm", resume=resume)
    assert _digests(tmp_path / "scm") == before and (tmp_path / "scm" / ROWS).stat().st_size > 0


def test_the_training_tier_records_its_owner_and_serving_refuses_it(tmp_path):
    # item 9: the marker serving checks, and the serving tier checking it before any write
    from embeddings.ssd.serving import ServingTier
    from embeddings.ssd.tier import training_tier_owner

    o = SparseOptimizer("adagrad", 0.1)
    t = ScmTier(tmp_path / "scm", TABLES, o, 5, 4096, io="buffered", owner=str(tmp_path / "run"))
    t.write_rows(torch.tensor([3]), *random_rows(1))
    t.prepare()
    t.close()
    said = training_tier_owner(tmp_path / "scm")
    assert (
        said
        == f"the SSD tier of the training run in {tmp_path / 'run'} (tier {t.tier_id.hex()[:16]})"
    )
    assert training_tier_owner(tmp_path) is None
    before = _digests(tmp_path / "scm")
    with pytest.raises(ScmError, match=r"--scm-dir .*scm: holds the SSD tier of the training run"):
        ServingTier(tmp_path / "scm", TABLES, ["int8", "int8"], [], 4096, io="buffered")
    assert _digests(tmp_path / "scm") == before


@pytest.mark.parametrize("where", ["a file", "below a file"])
def test_a_tier_directory_that_cannot_be_one_is_one_line(tmp_path, where):
    # item 11
    (tmp_path / "f").write_text("x")
    path = tmp_path / "f" if where == "a file" else tmp_path / "f" / "scm"
    with pytest.raises(ScmError, match=r"^--scm-dir: .*f(/scm)? (is a file|cannot be created)"):
        tier(path)


def test_a_tier_on_a_read_only_file_system_is_one_line(tmpfs):
    ro = tmpfs("size=64k,ro")
    with pytest.raises(ScmError, match=r"^--scm-dir: .*scm cannot be written: .* is not writable"):
        tier(ro / "scm")


def test_a_tier_is_used_by_one_process_at_a_time(tmp_path):
    # item 3, the tier's side: its directory's lock (tests/dlrm/test_run_lock.py has the rest)
    import subprocess
    import textwrap
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = textwrap.dedent(f"""
        import time
        from hybrid_dlrm.common.lock import DirectoryLock
        DirectoryLock({str(tmp_path / "scm")!r}).acquire("--scm-dir")
        print("held", flush=True)
        time.sleep(600)
    """)  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(root))
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, env=env, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(ScmError, match=rf"^--scm-dir: .*scm is in use .*process {proc.pid}"):
            tier(tmp_path / "scm")
        assert not (tmp_path / "scm" / ROWS).exists()
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("io,engine", [("buffered", "threads"), ("direct", "threads")])
def test_a_full_disk_under_the_tier_is_one_line_naming_it(tmpfs, io, engine):
    # item 11: a file system filling up gives short writes, then ENOSPC: either is the one line
    disk = tmpfs("size=16k")
    try:
        t = tier(disk / "scm", cache_rows=0, io=io, engine=engine)
    except ScmError as e:  # tmpfs without O_DIRECT: the buffered case covers it
        pytest.skip(str(e))
    with pytest.raises(
        ScmError, match=rf"^{disk}/scm/\S+: no space left on the file system mounted at {disk} "
    ):
        for a in range(0, 2000, 500):  # several blocks in one write: a short one when full
            t.write_rows(torch.arange(a, a + 500), *random_rows(500))
            t.flush()
    t.close()

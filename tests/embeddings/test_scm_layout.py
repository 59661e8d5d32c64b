"""The SSD tier's row layout (embeddings/ssd/layout.py): a permutation of the tier file's rows
chosen from the access profile, stored beside tier.json and verified when the tier opens, and
the blocks it saves on a skewed trace, counted exactly."""

import json

import numpy as np
import pytest
import torch

from embeddings.config import SparseOptimizer, TableSpec
from embeddings.errors import ScmError
from embeddings.ssd.file import BLOCK
from embeddings.ssd.layout import LAYOUT_FILE, RowLayout, count_levels, profile_layout
from embeddings.ssd.tier import MANIFEST, ScmTier
from perfmodel.row_cache_model import replay_row_cache

TABLES = [TableSpec("t0", 300, 8, "f0"), TableSpec("t1", 2000, 8, "f1")]
TOTAL = 2300
OPT = SparseOptimizer("adagrad", 0.1)
ROW_BYTES = 4 * 16  # dim 8 and Adagrad's 8 floats of state
RPB = 63  # rows per 4 KiB block at that width


def tier(path, layout=None, cache_rows=64, resume=False):
    return ScmTier(path, TABLES, OPT, 5, cache_rows * ROW_BYTES, io="buffered", io_threads=4,
                   resume=resume, layout=layout)  # fmt: skip


def scattered_layout(n=500, seed=3) -> RowLayout:
    return RowLayout(np.random.default_rng(seed).permutation(TOTAL)[:n], TOTAL)


@pytest.mark.parametrize("total,placed", [(10, 0), (10, 1), (10, 10), (2300, 7), (2300, 1500)])
def test_the_layout_is_a_permutation_and_rows_is_its_inverse(total, placed):
    ids = np.random.default_rng(placed).permutation(total)[:placed]
    layout = RowLayout(ids, total)
    slots = layout.slots(np.arange(total))
    assert np.array_equal(np.sort(slots), np.arange(total))  # every slot once
    assert np.array_equal(layout.rows(slots), np.arange(total))
    assert np.array_equal(layout.slots(ids), np.arange(placed))  # the placed rows first
    rest = np.setdiff1d(np.arange(total), ids)  # then the others in row-id order
    assert np.array_equal(layout.slots(rest), np.arange(placed, total))


def test_the_profile_layout_puts_the_most_counted_first_and_an_inputs_rows_together():
    counts = [np.array([0, 5, 1, 1, 0, 2]), np.array([3, 0, 1, 1])]
    # two kept inputs: input 0 reads rows 2 and 9 (table 1's row 3), input 1 rows 3 and 8
    lengths, values = np.array([[1, 1], [1, 1]]), np.array([2, 3, 3, 2])
    layout = profile_layout(counts, [6, 4], np.array([1]), lengths, values)  # row 1 is hot
    assert layout.placed.tolist() == [6, 5, 2, 9, 3, 8]
    assert profile_layout(counts, [6, 4], np.array([1]), lengths, values, max_rows=2).placed.tolist() == [6, 5]  # fmt: skip


@pytest.mark.parametrize("max_rows", [1, 500, 5000, 150_000])
def test_a_capped_layout_is_the_uncapped_ones_head(max_rows):
    # found by a histogram of counts, not by gathering every row: the same rows, even where
    # the rows of the capped count level are all hot or all past the cap
    rng = np.random.default_rng(0)
    counts = [np.minimum(rng.zipf(1.5, 100_000) - 1, 1000).astype(np.int32) for _ in range(3)]
    hot = np.sort(np.argsort(-np.concatenate(counts), kind="stable")[:2000])  # the most counted
    full = profile_layout(counts, [100_000] * 3, hot)
    capped = profile_layout(counts, [100_000] * 3, hot, max_rows=max_rows)
    assert np.array_equal(capped.placed, full.placed[:max_rows])
    # the planner makes the count levels once for all its candidates' layouts: the same rows
    levels = count_levels(counts)
    again = profile_layout(counts, [100_000] * 3, hot, max_rows=max_rows, levels=levels)
    assert np.array_equal(again.placed, capped.placed)


def test_rows_round_trip_through_a_laid_out_tier_as_through_row_id_order(tmp_path):
    ids = torch.randperm(TOTAL, generator=torch.Generator().manual_seed(1))[:900]
    g = torch.Generator().manual_seed(2)
    w, s = torch.randn(900, 8, generator=g), torch.rand(900, 8, generator=g)
    tiers = [tier(tmp_path / "plain"), tier(tmp_path / "laid", scattered_layout())]
    for t in tiers:  # mini-batch-sized pieces through a cache of 64 rows: evictions, writes
        for a in range(0, 900, 100):
            t.read_rows(ids[a : a + 100])
            t.write_rows(ids[a : a + 100], w[a : a + 100], s[a : a + 100])
    everything = torch.arange(TOTAL)
    plain, laid = (t.split_rows(t.peek_rows(everything)) for t in tiers)
    assert torch.equal(plain[0], laid[0]) and torch.equal(plain[1], laid[1])
    assert torch.equal(laid[0][ids], w)  # the written rows, and every other row initial
    laid_t = tiers[1]
    laid_t.flush()  # the rows are where the layout says in the file itself
    slot = int(laid_t.row_layout.slots(np.array([int(ids[0])]))[0])
    block = laid_t.file.read(np.array([slot // RPB]))
    row = block[0, (slot % RPB) * ROW_BYTES : (slot % RPB + 1) * ROW_BYTES].view(np.float32)
    assert np.array_equal(row[:8], w[0].numpy())


def test_a_resumed_tier_keeps_its_layout_and_an_edited_or_swapped_one_is_refused(tmp_path):
    path = tmp_path / "scm"
    t = tier(path, scattered_layout())
    ids = torch.arange(0, TOTAL, 7)
    t.write_rows(ids, torch.ones(ids.numel(), 8), torch.ones(ids.numel(), 8))
    gen = t.prepare()
    t.commit(gen)
    tid, mat = t.tier_id, t.materialised.copy()
    t.close()
    record = json.loads((path / MANIFEST).read_text())["row_layout"]
    assert record["kind"] == "profile" and record["rows"] == 500 and "crc32" in record
    # resumed with another layout asked for (or none): the file's own is used
    r = tier(path, resume=True)
    r.restore(gen, tid, mat)
    assert np.array_equal(r.row_layout.placed, scattered_layout().placed)
    assert torch.equal(r.read_rows(ids)[0], torch.ones(ids.numel(), 8))
    r.close()
    good = (path / LAYOUT_FILE).read_bytes()
    edited = bytearray(good)
    edited[-1] ^= 1  # one row moved
    (path / LAYOUT_FILE).write_bytes(bytes(edited))
    with pytest.raises(ScmError, match=r"layout\.npy: the tier's row layout does not match tier\.json \(checksum differs"):  # fmt: skip
        tier(path, resume=True)
    np.save(path / LAYOUT_FILE, scattered_layout(seed=4).placed)  # another tier's, same size
    with pytest.raises(ScmError, match=r"layout\.npy: the tier's row layout does not match tier\.json \(checksum differs"):  # fmt: skip
        tier(path, resume=True)
    (path / LAYOUT_FILE).unlink()
    with pytest.raises(ScmError, match=r"layout\.npy: the tier's row layout does not match tier\.json \(unreadable"):  # fmt: skip
        tier(path, resume=True)


def test_a_layout_naming_a_row_twice_is_refused_even_with_its_checksum(tmp_path):
    path = tmp_path / "scm"
    tier(path, scattered_layout()).close()
    placed = scattered_layout().placed.copy()
    placed[1] = placed[0]  # two rows in one slot: a hand-made file, checksum recomputed
    np.save(path / LAYOUT_FILE, placed)
    m = json.loads((path / MANIFEST).read_text())
    from hybrid_dlrm.common.manifest import file_record

    m["row_layout"].update(file_record(path / LAYOUT_FILE))
    (path / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(ScmError, match=r"layout\.npy: not distinct rows of the tier's 2300"):
        tier(path, resume=True)


def test_a_tier_written_before_layouts_opens_in_row_id_order(tmp_path):
    path = tmp_path / "scm"
    t = tier(path)
    ids = torch.arange(5, TOTAL, 11)
    w = torch.randn(ids.numel(), 8, generator=torch.Generator().manual_seed(0))
    t.write_rows(ids, w, torch.zeros(ids.numel(), 8))
    gen = t.prepare()
    t.commit(gen)
    tid, mat = t.tier_id, t.materialised.copy()
    t.close()
    m = json.loads((path / MANIFEST).read_text())
    del m["row_layout"]
    m["version"] = 2  # as a tier of the previous format wrote it
    (path / MANIFEST).write_text(json.dumps(m))
    r = tier(path, scattered_layout(), resume=True)  # a layout asked for: the tier's own wins
    r.restore(gen, tid, mat)
    assert r.row_layout.kind == "identity"
    assert torch.equal(r.read_rows(ids)[0], w)


# --- what the layout saves, counted --------------------------------------------------------------

# a skewed trace: 12 rows scattered over the tables (blocks 0, 3, ..., 33 in row-id order) take
# most of every batch's reads; the rest are two rows of the tail (blocks 3b+1 and 3b+2)
WARM = np.arange(12) * 190 + 3
TAIL = [np.array([63 * (3 * b + 1) + 5, 63 * (3 * b + 2) + 5]) for b in range(6)]


def _trace() -> list[torch.Tensor]:
    return [torch.from_numpy(np.sort(np.concatenate([WARM, t]))) for t in TAIL]


def _profile_layout() -> RowLayout:
    counts = np.zeros(TOTAL, np.int64)
    counts[WARM] = 50  # the profile counted the warm rows most; the tail once each
    for t in TAIL:
        counts[t] += 1
    return profile_layout([counts[:300], counts[300:]], [300, 2000])


def test_the_layout_reads_fewer_blocks_on_a_skewed_trace_exact_counts(tmp_path):
    # no row cache: every row of every batch is read from its block (all blocks written first)
    counted = {}
    for name, layout in (("identity", None), ("profile", _profile_layout())):
        t = tier(tmp_path / name, layout, cache_rows=0)
        t.fill()
        for ids in _trace():
            t.read_rows(ids)
        c = t.counters()
        counted[name] = (c["scm_rows_read"], c["scm_blocks_read"], c["scm_bytes_read"])
        assert c["scm_read_amplification"] == round(c["scm_bytes_read"] / (c["scm_rows_read"] * ROW_BYTES), 2)  # fmt: skip
        assert c["scm_rows_per_block_read"] == round(c["scm_rows_read"] / c["scm_blocks_read"], 3)
    # row-id order: each warm row in a block of its own, each tail row too: 14 blocks a batch
    assert counted["identity"] == (84, 84, 84 * BLOCK)  # read amplification 64
    # the profile's: the 12 warm rows in one block, and the 12 tail rows (counted once each,
    # placed after them) in that block too: one block a batch
    assert counted["profile"] == (84, 6, 6 * BLOCK)  # read amplification 4.57
    # the planner's replay of the same trace counts the same blocks
    for name, layout in (("identity", None), ("profile", _profile_layout())):
        rep = replay_row_cache(_trace(), TOTAL, 0, RPB, layout=layout)
        assert sum(rep.miss_blocks) == counted[name][1]

"""Slipstream's refilling stream against a reference: the kept inputs, in order, cut into batches."""

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm.pipelines.slipstream_inputs import Cursor, RefillingStream, random_kept

B = 8


def source(sizes: list[int], rows_per_input: int = 1) -> list[Batch]:
    """Batches whose labels are the inputs' global numbers and whose every row's single lookup
    (two tables) and dense value name its input, so a selection can be checked row by row."""
    out, first = [], 0
    for n in sizes:
        ids = torch.arange(first, first + n)
        rows = ids.repeat_interleave(rows_per_input)
        kjt = KeyedJaggedTensor(
            keys=["x", "y"], values=torch.cat([rows, rows + 1000]),
            lengths=torch.ones(2 * rows.numel(), dtype=torch.int64), stride=rows.numel(),
        )  # fmt: skip
        out.append(Batch(rows.float().unsqueeze(1), kjt, ids.float()))
        first += n
    return out


def kept_mask(seed: int, sizes: list[int]) -> list[np.ndarray]:
    gen = np.random.default_rng(seed)
    return [gen.random(n) < 0.6 for n in sizes]


def reference(sizes, masks, start: Cursor = Cursor()) -> list[list[int]]:
    firsts = np.cumsum([0] + sizes[:-1])
    kept = [
        int(firsts[j] + i)
        for j, m in enumerate(masks)
        for i in np.flatnonzero(m)
        if (j, i) >= (start.batch, start.position)
    ]
    return [kept[i : i + B] for i in range(0, len(kept), B)]


def drain(stream: RefillingStream, it, n: int | None = None) -> list[list[int]]:
    got = []
    for batch in it:
        got.append(batch.labels.long().tolist())
        stream.trained()
        if n is not None and len(got) == n:
            break
    return got


def test_refilled_batches_are_the_kept_inputs_in_order_and_the_cursor_is_exact():
    sizes = [8, 8, 8, 8, 8, 5]
    masks = kept_mask(0, sizes)
    masks[2][:] = False  # a whole batch dropped
    masks[5][:] = False  # and the epoch's tail: the last mini-batch consumes it
    batches = source(sizes)
    stream = RefillingStream(B, len(sizes), lambda j, b: masks[j])
    stream.open(iter(batches), Cursor())
    it, got, cursors, dropped = stream.restart(), [], [], 0
    for batch in it:
        got.append(batch.labels.long().tolist())
        y = stream.trained()
        cursors.append(y.cursor)
        dropped += y.dropped
        assert y.trained == batch.labels.numel() and y.dropped_lookups == 2 * y.dropped
        # the dense value and both lookups of each row belong to the input its label names
        assert batch.dense_features.squeeze(1).tolist() == batch.labels.tolist()
        v = batch.sparse_features.values().view(2, -1)
        assert v[0].tolist() == batch.labels.long().tolist() and torch.equal(v[1], v[0] + 1000)
    assert got == reference(sizes, masks)
    assert all(len(g) == B for g in got[:-1]) and 0 < len(got[-1]) <= B
    assert dropped == sum(int((~m).sum()) for m in masks)
    assert cursors[-1] == Cursor(len(sizes), 0)  # the dropped tail went with the last batch
    firsts = np.cumsum([0] + sizes)
    for c, g in zip(cursors[:-1], got[1:]):  # each cursor is the next batch's first input
        assert firsts[c.batch] + c.position == g[0]


def test_all_kept_batches_pass_through_untouched_and_tbsm_inputs_stay_whole():
    sizes = [8, 8, 8]
    batches = source(sizes)
    stream = RefillingStream(B, 3, lambda j, b: None)
    stream.open(iter(batches), Cursor())
    assert [b is s for b, s in zip(stream.restart(), batches)] == [True] * 3
    tbsm = source(sizes, rows_per_input=3)
    masks = kept_mask(4, sizes)
    stream = RefillingStream(B, 3, lambda j, b: masks[j])
    stream.open(iter(tbsm), Cursor())
    for batch, want in zip(stream.restart(), reference(sizes, masks)):
        stream.trained()
        assert batch.labels.long().tolist() == want
        rows = torch.tensor(want).repeat_interleave(3)
        assert batch.sparse_features.stride() == rows.numel()
        assert torch.equal(batch.sparse_features.values()[: rows.numel()], rows)
        assert torch.equal(batch.dense_features.squeeze(1).long(), rows)


def test_restart_decides_what_was_read_ahead_again_and_a_resumed_stream_continues_alike():
    sizes = [8] * 6
    first, second = kept_mask(1, sizes), kept_mask(2, sizes)
    masks = {"now": first}
    stream = RefillingStream(B, 6, lambda j, b: masks["now"][j])
    stream.open(iter(source(sizes)), Cursor())
    it = stream.restart()
    got = drain(stream, it, 2)
    next(it)  # read ahead (a pipeline staging the next batch), not trained
    masks["now"] = second  # a snapshot changed the stale set
    cursor = stream.cursor
    rest = drain(stream, stream.restart())
    assert got == reference(sizes, first)[:2]
    assert rest == reference(sizes, second, cursor)
    # a run resumed at that cursor: the trainer's source from the cursor's batch on
    resumed = RefillingStream(B, 6, lambda j, b: second[j])
    resumed.open(iter(source(sizes)[cursor.batch :]), cursor)
    assert drain(resumed, resumed.restart()) == rest


def test_a_stream_with_nothing_left_consumes_the_rest():
    sizes = [8, 8]
    stream = RefillingStream(B, 2, lambda j, b: np.zeros(b.labels.numel(), dtype=bool))
    stream.open(iter(source(sizes)), Cursor())
    assert list(stream.restart()) == []
    y = stream.finish()
    assert y.dropped == 16 and y.trained == 0 and stream.cursor == Cursor(2, 0)


def test_random_control_is_a_function_of_its_batch():
    a = random_kept(7, 1, 3, 10_000, 0.25)
    assert np.array_equal(a, random_kept(7, 1, 3, 10_000, 0.25))
    assert not np.array_equal(a, random_kept(7, 1, 4, 10_000, 0.25))
    assert abs((~a).mean() - 0.25) < 0.02


def test_the_threshold_sample_skips_the_profiled_batches():
    """`sample(avoid)`: the first source batch at or after the cursor not in `avoid` (the
    batches the access profile read), the cursor's own when all near ones are avoided, and at
    the epoch's end the last one consumed."""
    sizes = [8] * 6
    stream = RefillingStream(B, 6, lambda j, b: None)
    stream.open(iter(source(sizes)), Cursor())
    assert stream.sample().labels[0] == 0
    assert stream.sample(frozenset({0, 1, 3})).labels[0] == 16
    assert stream.sample(frozenset(range(6)), ahead=6).labels[0] == 0
    drain(stream, stream.restart(), 3)
    assert stream.cursor == Cursor(3, 0)
    assert stream.sample(frozenset({0, 3, 4})).labels[0] == 40
    drain(stream, stream.restart())
    assert stream.sample(frozenset({5})).labels[0] == 40  # the epoch is over: the last consumed

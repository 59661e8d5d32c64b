"""Taobao UserBehavior pipeline: parser vs reference, windows vs a per-user Python reference,
the time split (no future in training), id remapping, bucket independence, errors, batches."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_pipeline.errors import DataError
from data_pipeline.taobao import TaobaoOptions, load_taobao_meta, preprocess_taobao
from data_pipeline.taobao_dataset import TaobaoBatchSource
from data_pipeline.taobao_format import BEHAVIORS, BadLine, check_line, parse_block
from data_pipeline.taobao_synthetic import PlantedBehavior, generate_events, write_user_behavior

SMALL = PlantedBehavior(
    num_users=120, min_events=8, max_events=20, num_categories=6, items_per_category=15, seed=3
)
T = 4


# --- parser --------------------------------------------------------------------------------------

_field = st.one_of(
    st.integers(0, 10**18 - 1).map(lambda v: str(v).encode()),
    st.sampled_from([b"", b"-1", b"1.5", b" 7", b"0x1", b"1" * 19, b"00012"]),
)
_behavior = st.one_of(
    st.sampled_from([b.encode() for b in BEHAVIORS]),
    st.sampled_from([b"", b"PV", b"pvv", b"p", b"cart "]),
)
_line = st.one_of(
    st.tuples(_field, _field, _field, _behavior, _field).map(lambda f: b",".join(f)),
    st.lists(_field, min_size=0, max_size=7).map(lambda f: b",".join(f)),
    st.binary(max_size=30).filter(lambda b: b"\n" not in b),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_line, min_size=1, max_size=25))
def test_parse_block_matches_reference(lines):
    parsed = parse_block(b"\n".join(lines) + b"\n")
    expected = [check_line(line) for line in lines]
    good = [i for i, e in enumerate(expected) if not isinstance(e, BadLine)]
    assert parsed.lines.tolist() == good
    got = list(zip(parsed.users.tolist(), parsed.items.tolist(), parsed.categories.tolist(),
                   parsed.behaviors.tolist(), parsed.timestamps.tolist()))  # fmt: skip
    assert got == [expected[i] for i in good]
    assert [(b.index, b.reason) for b in parsed.bad] == [
        (i, e.reason) for i, e in enumerate(expected) if isinstance(e, BadLine)
    ]


def test_parse_block_examples():
    rows = parse_block(b"1,2268318,2520377,pv,1511544070\r\n7,8,9,fav,12\n")
    assert rows.users.tolist() == [1, 7] and rows.behaviors.tolist() == [0, 3]
    assert rows.timestamps.tolist() == [1511544070, 12]
    bad = parse_block(b"1,2,3,pv\n1,2,3,click,5\n").bad
    assert [b.reason for b in bad] == ["field_count", "behavior_type"]
    assert "expected one of pv, buy, cart, fav" in bad[1].message


# --- preprocessing: a reference built the obvious way -----------------------------------------


def _reference_positives(raw_events: dict, meta: dict, vocab: dict) -> dict[str, set]:
    """Per split, the set of (user, items tuple, categories tuple) windows a positive can have,
    computed per user in Python; with points_per_user large every eligible target is chosen."""
    cut_val, cut_test = meta["cut_times"]["val"], meta["cut_times"]["test"]
    remap = {f: {int(r): i for i, r in enumerate(vocab[f])} for f in vocab}
    by_user: dict[int, list] = {}
    for line, (u, i, c, t) in enumerate(zip(raw_events["user"], raw_events["item"], raw_events["category"],
                                            raw_events["timestamp"])):  # fmt: skip
        by_user.setdefault(int(u), []).append(
            (int(t), line, remap["item"][int(i)], remap["category"][int(c)])
        )
    out = {"train": set(), "val": set(), "test": set()}
    for u, events in by_user.items():
        events.sort()
        for k in range(T, len(events)):
            window = events[k - T : k + 1]
            t = events[k][0]
            split = "train" if t < cut_val else "val" if t < cut_test else "test"
            out[split].add(
                (remap["user"][u], tuple(e[2] for e in window), tuple(e[3] for e in window))
            )
    return out


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("taobao")
    raw = root / "UserBehavior.csv"
    write_user_behavior(raw, SMALL, users_per_block=40)
    out = preprocess_taobao(
        raw, root / "out", TaobaoOptions(ts_length=T, points_per_user=1000, buckets=3)
    )
    return raw, out


def _split_rows(out, split):
    return {
        c: np.load(out / f"{split}.{c}.npy", allow_pickle=False)
        for c in ("items", "categories", "users", "labels", "times")
    }


def test_windows_match_reference(small_dataset):
    raw, out = small_dataset
    meta = load_taobao_meta(out)
    vocab = {f: np.load(out / "vocab" / f"{f}.npy") for f in meta["feature_names"]}
    ev = generate_events(SMALL)
    # the file's line order is shuffled; the reference sorts per user by time, which is unique here
    expected = _reference_positives(ev, meta, vocab)
    for split in ("train", "val", "test"):
        r = _split_rows(out, split)
        pos = r["labels"] == 1
        got = {
            (int(u), tuple(i), tuple(c))
            for u, i, c in zip(
                r["users"][pos], r["items"][pos].tolist(), r["categories"][pos].tolist()
            )
        }
        assert got == expected[split], split
        assert meta["splits"][split]["positives"] == len(expected[split])


def test_ids_remapped_by_count_and_table_sizes(small_dataset):
    raw, out = small_dataset
    meta = load_taobao_meta(out)
    ev = generate_events(SMALL)
    for f, key in zip(meta["feature_names"], ("user", "item", "category")):
        vocab = np.load(out / "vocab" / f"{f}.npy")
        values, counts = np.unique(ev[key], return_counts=True)
        assert meta["table_sizes"][meta["feature_names"].index(f)] == len(values)
        order = np.lexsort((values, -counts))
        assert vocab.tolist() == values[order].tolist()  # hottest first, ties by raw id


def test_no_future_in_training_and_negatives(small_dataset):
    raw, out = small_dataset
    meta = load_taobao_meta(out)
    ev = generate_events(SMALL)
    item_of = {}
    vocab = {f: np.load(out / "vocab" / f"{f}.npy") for f in meta["feature_names"]}
    for i, c in zip(ev["item"], ev["category"]):
        item_of[int(i)] = int(c)
    cat_id = {int(r): k for k, r in enumerate(vocab["category"])}
    for split in ("train", "val", "test"):
        r = _split_rows(out, split)
        assert (
            len(r["labels"]) and (r["labels"][0::2] == 1).all() and (r["labels"][1::2] == 0).all()
        )
        # a negative shares its positive's history, its target is another item with that item's category
        assert (r["items"][0::2, :-1] == r["items"][1::2, :-1]).all()
        assert (r["items"][0::2, -1] != r["items"][1::2, -1]).all()
        neg_items = vocab["item"][r["items"][1::2, -1]]
        assert [cat_id[item_of[int(i)]] for i in neg_items] == r["categories"][1::2, -1].tolist()
        # the negative was not touched by the user up to the target
        for row in range(1, len(r["labels"]), 2):
            assert r["items"][row, -1] not in set(r["items"][row, :-1].tolist())
    train_times = _split_rows(out, "train")["times"]
    assert train_times.max() < meta["cut_times"]["val"] <= _split_rows(out, "val")["times"].min()
    assert _split_rows(out, "test")["times"].min() >= meta["cut_times"]["test"]


def test_content_independent_of_buckets_and_reused(small_dataset, tmp_path):
    raw, out = small_dataset
    one = preprocess_taobao(
        raw, tmp_path / "one", TaobaoOptions(ts_length=T, points_per_user=3, buckets=1)
    )
    five = preprocess_taobao(
        raw, tmp_path / "five", TaobaoOptions(ts_length=T, points_per_user=3, buckets=5)
    )
    for split in ("train", "test"):
        a, b = _split_rows(one, split), _split_rows(five, split)
        rows = lambda r: sorted(zip(r["users"].tolist(), r["items"].tolist(), r["labels"].tolist()))  # noqa: E731
        assert rows(a) == rows(b)
    assert load_taobao_meta(one)["made_by"]["buckets"] == 1
    # same file and settings: reused as is; other settings: one clear error
    assert (
        preprocess_taobao(
            raw, tmp_path / "one", TaobaoOptions(ts_length=T, points_per_user=3, buckets=4)
        )
        == one
    )
    with pytest.raises(
        DataError, match=r"made with other settings \(settings.points_per_user: 3 there, 4 asked\)"
    ):
        preprocess_taobao(raw, tmp_path / "one", TaobaoOptions(ts_length=T, points_per_user=4))


def test_bad_lines_name_file_and_line(tmp_path):
    raw = tmp_path / "ub.csv"
    info = write_user_behavior(raw, PlantedBehavior(num_users=30, min_events=6, max_events=8, seed=1),
                               bad_lines={"behavior_type": 1, "timestamp": 1})  # fmt: skip
    first = min(n for ns in info["bad_lines"].values() for n in ns)
    kind = next(k for k, ns in info["bad_lines"].items() if first in ns)
    with pytest.raises(DataError) as e:
        preprocess_taobao(raw, tmp_path / "out", TaobaoOptions(ts_length=3))
    assert str(e.value).startswith(f"{raw}:{first}: {kind}: ")
    assert "\n" not in str(e.value)
    assert (
        not (tmp_path / "out" / "meta.json").exists() and not (tmp_path / "out" / "_work").exists()
    )
    out = preprocess_taobao(raw, tmp_path / "out", TaobaoOptions(ts_length=3, on_bad_line="skip"))
    meta = json.loads((out / "meta.json").read_text())
    assert meta["bad_lines"] == {"behavior_type": 1, "timestamp": 1}
    assert meta["counts"]["events"] == info["events"]


def test_missing_and_not_preprocessed(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        preprocess_taobao(tmp_path / "nope.csv", tmp_path / "out")
    with pytest.raises(DataError, match="meta.json: not found"):
        TaobaoBatchSource(tmp_path, "train", 8)


# --- batches ---------------------------------------------------------------------------------


def test_batch_layouts(small_dataset):
    raw, out = small_dataset
    seq = TaobaoBatchSource(out, "train", 16, layout="sequence")
    cand = TaobaoBatchSource(out, "train", 16, layout="candidate")
    r = _split_rows(out, "train")
    b, c = seq.batch(0, 1), cand.batch(0, 1)
    rows = slice(16, 32)
    kjt = b.sparse_features
    assert kjt.keys() == ["user", "item", "category"] and kjt.stride() == 16 * (T + 1)
    # every history lookup is in the KJT, sample-major: bag b*(T+1)+j is step j of sample b
    assert kjt["item"].values().view(16, T + 1).tolist() == r["items"][rows].tolist()
    assert kjt["category"].values().view(16, T + 1).tolist() == r["categories"][rows].tolist()
    assert (
        kjt["user"].values().view(16, T + 1).tolist()
        == np.repeat(r["users"][rows, None], T + 1, 1).tolist()
    )
    assert b.dense_features.view(16, T + 1).tolist()[0] == pytest.approx(
        [j / (T + 1) for j in range(T + 1)]
    )
    assert b.labels.tolist() == r["labels"][rows].tolist() == c.labels.tolist()
    assert c.sparse_features.stride() == 16 and c.dense_features.shape == (16, 1)
    assert c.sparse_features["item"].values().tolist() == r["items"][rows, -1].tolist()


def test_shuffled_batches_replay_and_shard(small_dataset):
    raw, out = small_dataset
    src = TaobaoBatchSource(out, "train", 32, randomize=True, seed=5)
    all_rows = np.concatenate([src.rows(1, i) for i in range(len(src))])
    assert sorted(all_rows.tolist()) == list(range(src.num_samples))
    assert not np.array_equal(all_rows, np.concatenate([src.rows(2, i) for i in range(len(src))]))
    replay = list(src.batches(1, start=2))[0]
    assert replay.labels.tolist() == src.batch(1, 2).labels.tolist()
    shards = [
        TaobaoBatchSource(out, "train", 32, randomize=True, seed=5, rank=k, world_size=2)
        for k in range(2)
    ]
    assert sorted(np.concatenate([s.rows(1, 0) for s in shards]).tolist()) == sorted(
        src.rows(1, 0).tolist()
    )

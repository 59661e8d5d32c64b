"""Raw Taobao `UserBehavior.csv` -> a TBSM window dataset directory (streaming, bounded memory).

Output (all `.npy` and JSON, no pickle; N rows per split, T = `ts_length`):

    DIR/{split}.items.npy       int32 [N, T+1]  item ids of T history steps (oldest first), then
                                                 the target (candidate) item
    DIR/{split}.categories.npy  int32 [N, T+1]  their category ids
    DIR/{split}.users.npy       int32 [N]       the user's id
    DIR/{split}.labels.npy      int8  [N]       1: the real next item; 0: a sampled item
    DIR/{split}.times.npy       int64 [N]       timestamp of the real next event (the target slot)
    DIR/vocab/{feature}.npy     int64 [rows]    raw id of every row id (row id = position)
    DIR/meta.json               written last: table sizes, splits, cut times, counts, settings

splits are `train`, `val`, `test`.

Samples.  Per user, events are sorted by (timestamp, line in the file). Every event with at
least T earlier events of the same user is a possible target; its window is the T events
before it. Per user and split, up to `points_per_user` targets are chosen (pseudo-randomly,
keyed by the seed, the raw user id and the event's line, so the choice does not depend on how
the file was cut); each gives a positive sample (the real event) and a negative one: the same
history with the target replaced by an item drawn uniformly from the items this user had not
touched up to the target event (so a negative never depends on the user's future), with that
item's category. Users with fewer than T+1 events give
no samples (counted in meta.json).

Split rule (no user's future leaks into training).  Two cut times are taken from all events'
timestamps: `t_val`, the (1 - val_fraction - test_fraction) quantile, and `t_test`, the
(1 - test_fraction) quantile (both at minute resolution). A sample belongs to the split of its
target's timestamp: train if < t_val, val if < t_test, test otherwise. A window holds only
events at or before its target, so nothing a training sample contains (history, target or the
negative's label) happens at or after t_val: no user's future, and no event of the evaluation
period, is seen in training. The same user may appear in all three splits (their later
behaviour is what is evaluated), as in a production setting that retrains daily.

Ids.  Per table (user, item, category) the raw ids are remapped to 0..rows-1 in order of
descending event count (ties: ascending raw id), so the hottest rows come first.

Memory.  Pass 1 parses blocks and appends each event to one of K bucket files chosen by a hash
of its user (an external partition by user); it keeps only the per-table distinct values with
their counts and a per-minute histogram of timestamps. Pass 2 reads one bucket at a time, so
the peak is about 16 x raw size / K bytes (measured ~14x at T=20, 10 points per user) plus
O(distinct ids) plus the interpreter (~60 MB). K is derived from `memory_mb`; the content of the
output does not depend on K (only the order of its rows).
"""

from __future__ import annotations

import logging
import math
import platform
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from hybrid_dlrm.common.header import check_header

from . import dataset_meta as dm
from .categorical import FrequencyCounter, build_vocabulary
from .errors import DataError, unwritable_dir
from .npy_stream import NpyWriter
from .permutation import derive_key
from .raw_files import RawPart, comparable_identity, identity_checks, iter_blocks, raw_identity
from .taobao_format import BAD_REASONS, BEHAVIORS, parse_block

log = logging.getLogger(__name__)

FORMAT = "hybrid-dlrm/taobao-windows"
FORMAT_VERSION = 1
FEATURE_NAMES = ["user", "item", "category"]
SPLITS = ("train", "val", "test")
COLUMNS = ("items", "categories", "users", "labels", "times")
_BUCKET_COLUMNS = 6  # user, item, category, timestamp, behavior, line (raw values)
_MAX_EXAMPLES = 20
_NEG_ATTEMPTS = 64
_PEAK_PER_RAW_BYTE = 16


@dataclass(frozen=True)
class TaobaoOptions:
    ts_length: int = 20
    points_per_user: int = 10
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    seed: int = 0
    on_bad_line: str = "error"
    memory_mb: int = 2048  # working-set bound of pass 2 (decides the number of buckets)
    buckets: int = 0  # 0: from memory_mb
    block_bytes: int = 8 << 20
    progress: bool | None = None

    def validate(self) -> None:
        if self.ts_length < 1:
            raise DataError(f"--ts-length: expected a positive integer, got {self.ts_length}")
        if self.points_per_user < 1:
            raise DataError(
                f"--points-per-user: expected a positive integer, got {self.points_per_user}"
            )
        v, t = self.val_fraction, self.test_fraction
        if not (0 <= v and 0 < t and v + t < 1):
            raise DataError(
                f"val/test fractions: expected 0 <= val, 0 < test, val + test < 1; got {v}, {t}"
            )
        if self.on_bad_line not in ("error", "skip"):
            raise DataError(f"--on-bad-line: expected error or skip, got {self.on_bad_line!r}")
        if self.memory_mb < 1 or self.buckets < 0:
            raise DataError("memory_mb must be >= 1 and buckets >= 0")

    def settings(self) -> dict:
        """What decides the content of the output (not how it is computed)."""
        keys = (
            "ts_length",
            "points_per_user",
            "val_fraction",
            "test_fraction",
            "seed",
            "on_bad_line",
        )
        return {k: v for k, v in asdict(self).items() if k in keys}


# --- keyed hashing: randomness that depends on what is hashed, not on processing order ----------

_C1, _C2, _C3 = (
    np.uint64(0x9E3779B97F4A7C15),
    np.uint64(0xBF58476D1CE4E5B9),
    np.uint64(0x94D049BB133111EB),
)


def _mix64(x: np.ndarray) -> np.ndarray:
    x = x + _C1
    x = (x ^ (x >> np.uint64(30))) * _C2
    x = (x ^ (x >> np.uint64(27))) * _C3
    return x ^ (x >> np.uint64(31))


def keyed_hash(key: int, *columns: np.ndarray | int) -> np.ndarray:
    """A 64-bit hash per row of the given integer columns (scalars broadcast)."""
    n = max(np.size(c) for c in columns)
    h = np.full(n, np.uint64(derive_key(key)), dtype=np.uint64)
    for c in columns:
        h = _mix64(h ^ np.asarray(c).astype(np.int64).astype(np.uint64))
    return h


# --- the public entry point -----------------------------------------------------------------------


def preprocess_taobao(
    raw: str | Path, out: str | Path, options: TaobaoOptions = TaobaoOptions()
) -> Path:
    """Preprocess on first use, or reuse `out` when it was made from the same file and settings.

    Raises DataError (one line) for malformed input (FILE:LINE), a missing file, or an `out`
    made with other settings."""
    options.validate()
    raw, out = Path(raw), Path(out)
    if not raw.is_file():
        raise DataError(f"{raw}: no such file (expected the raw UserBehavior.csv)")
    identity = {"name": raw.name, **raw_identity(raw)}
    meta_path = out / "meta.json"
    if meta_path.is_file():
        meta = load_taobao_meta(out)
        recorded = meta.get("raw")
        wanted = {"settings": options.settings(), "raw": comparable_identity(recorded, identity)}
        found = {"settings": meta.get("settings"), "raw": recorded}
        log.info("raw file checked by %s", identity_checks(recorded))
        if found != wanted:
            what = (
                "with other settings"
                if found["settings"] != wanted["settings"]
                else ("from another raw file")
            )
            raise DataError(
                f"{out}: made {what} ({dm.describe_difference(found, wanted)}); "
                "delete it or choose another directory"
            )
        log.info("reusing %s", out)
        return out
    problem = unwritable_dir(out)
    if problem:
        raise DataError(f"{problem} (where the preprocessed data set goes)")
    return _Preprocess(raw, out, options, identity).run()


def load_taobao_meta(directory: str | Path) -> dict:
    path = Path(directory) / "meta.json"
    if not path.is_file():
        raise DataError(
            f"{path}: not found (not a preprocessed Taobao directory, or preprocessing did not finish)"
        )
    meta = dm.read_json(path)
    check_header(meta, path, format=FORMAT, versions=(FORMAT_VERSION,), kind="data set format",
                 what="preprocessed Taobao data set", error=DataError, version_key="format_version")  # fmt: skip
    return meta


# --- the two passes -------------------------------------------------------------------------------


class _Preprocess:
    def __init__(self, raw: Path, out: Path, options: TaobaoOptions, identity: dict):
        self.raw, self.out, self.opt, self.identity = raw, out, options, identity
        self.work = out / "_work"
        self.bad_counts = dict.fromkeys(BAD_REASONS, 0)
        self.bad_examples: list[str] = []
        self.counts = {"lines": 0, "events": 0, "behaviors": dict.fromkeys(BEHAVIORS, 0)}
        size = identity["bytes"]
        # measured: pass 2 peaks at ~14x the raw bytes of a bucket (T=20, 10 points per user:
        # sorted events, remapped columns, and the windows of positives and negatives)
        self.num_buckets = options.buckets or max(
            1, math.ceil(_PEAK_PER_RAW_BYTE * size / (options.memory_mb << 20))
        )

    def run(self) -> Path:
        started = time.time()
        self.out.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.work, ignore_errors=True)  # an interrupted run's partition
        self.work.mkdir()
        try:
            counter = self._partition()
            if self.counts["events"] == 0:
                raise DataError(f"{self.raw}: no valid events")
            vocab = self._vocabularies(counter)
            cuts = self._cut_times(counter)
            item_cat = self._item_categories(vocab)
            splits = self._windows(vocab, item_cat, cuts)
        finally:
            shutil.rmtree(self.work, ignore_errors=True)
        self._write_meta(vocab, cuts, splits, started)
        return self.out

    # pass 1 ------------------------------------------------------------------------------------

    def _partition(self) -> FrequencyCounter:
        """Parse the raw file into bucket files; count distinct ids and minutes."""
        counter = FrequencyCounter(4)  # user, item, category, minute of the timestamp
        writers = [
            NpyWriter(self.work / f"bucket_{b}.npy", np.int64, (_BUCKET_COLUMNS,))
            for b in range(self.num_buckets)
        ]
        part = RawPart("raw", self.raw)
        line0 = 1
        bar = tqdm(total=part.size(), unit="B", unit_scale=True, desc="taobao: parse",
                   disable=not (self.opt.progress if self.opt.progress is not None else sys.stderr.isatty()))  # fmt: skip
        try:
            for block in iter_blocks(part, self.opt.block_bytes):
                # plain files: the reader hands out byte ranges that whoever parses reads
                rows = parse_block(block.data if block.data is not None else block.lines())
                self._take_bad(rows.bad, line0)
                if len(rows):
                    table = np.stack([rows.users, rows.items, rows.categories, rows.timestamps,
                                      rows.behaviors.astype(np.int64), rows.lines + line0], axis=1)  # fmt: skip
                    bucket = (
                        _mix64(rows.users.astype(np.uint64)) % np.uint64(self.num_buckets)
                    ).astype(np.int64)
                    order = np.argsort(bucket, kind="stable")
                    cuts = np.searchsorted(bucket[order], np.arange(self.num_buckets + 1))
                    for b in range(self.num_buckets):
                        if cuts[b + 1] > cuts[b]:
                            writers[b].append(table[order[cuts[b] : cuts[b + 1]]])
                    for f, col in enumerate(
                        (rows.users, rows.items, rows.categories, rows.timestamps // 60)
                    ):
                        counter.add(f, *np.unique(col, return_counts=True))
                    beh = np.bincount(rows.behaviors, minlength=len(BEHAVIORS))
                    for name, c in zip(BEHAVIORS, beh):
                        self.counts["behaviors"][name] += int(c)
                self.counts["lines"] += rows.num_lines
                self.counts["events"] += len(rows)
                line0 += rows.num_lines
                bar.update(block.consumed - bar.n)
            for w in writers:
                w.finish()
        except BaseException:
            for w in writers:
                w.abort()
            raise
        finally:
            bar.close()
        return counter

    def _take_bad(self, bad, line0: int) -> None:
        for b in bad:
            where = f"{self.raw}:{line0 + b.index}"
            if self.opt.on_bad_line == "error":
                raise DataError(
                    f"{where}: {b.message} (pass --on-bad-line skip to drop such lines)"
                )
            self.bad_counts[b.reason] += 1
            if len(self.bad_examples) < _MAX_EXAMPLES:
                self.bad_examples.append(f"{where}: {b.message}")
        if bad:
            log.warning(
                "%s: skipped %d malformed lines so far", self.raw, sum(self.bad_counts.values())
            )

    # between the passes ------------------------------------------------------------------------

    def _vocabularies(self, counter: FrequencyCounter) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per table (sorted raw values, row id of each sorted value); writes vocab/*.npy."""
        (self.out / "vocab").mkdir(exist_ok=True)
        vocab = []
        for f, name in enumerate(FEATURE_NAMES):
            values, counts = counter.result(f)
            by_count, _, _ = build_vocabulary(values, counts, threshold=1)
            ids = np.empty(len(values), dtype=np.int64)
            ids[np.searchsorted(values, by_count)] = np.arange(len(by_count))
            writer = NpyWriter(self.out / "vocab" / f"{name}.npy", np.int64)
            writer.append(by_count.astype(np.int64))
            writer.finish()
            vocab.append((values, ids))
        if max(len(v) for v, _ in vocab) >= 2**31:
            raise DataError(f"{self.raw}: a table has 2**31 or more distinct ids; not supported")
        return vocab

    def _cut_times(self, counter: FrequencyCounter) -> dict:
        minutes, counts = counter.result(3)
        cum = np.cumsum(counts)
        total = int(cum[-1])

        def quantile(q: float) -> int:
            return (
                int(minutes[min(np.searchsorted(cum, q * total, side="left"), len(minutes) - 1)])
                * 60
            )

        o = self.opt
        return {
            "val": quantile(1 - o.val_fraction - o.test_fraction),
            "test": quantile(1 - o.test_fraction),
        }

    def _buckets(self):
        for b in range(self.num_buckets):
            path = self.work / f"bucket_{b}.npy"
            yield np.load(path, mmap_mode="r", allow_pickle=False)

    @staticmethod
    def _ids(vocab: tuple[np.ndarray, np.ndarray], raw: np.ndarray) -> np.ndarray:
        values, ids = vocab
        return ids[np.searchsorted(values, raw)]

    def _item_categories(self, vocab) -> np.ndarray:
        """Each item's category: that of its first event in the file (items rarely have two)."""
        n_items = len(vocab[1][0])
        first_line = np.full(n_items, np.iinfo(np.int64).max, dtype=np.int64)
        item_cat = np.zeros(n_items, dtype=np.int32)
        for bucket in self._buckets():
            if len(bucket):
                np.minimum.at(
                    first_line, self._ids(vocab[1], bucket[:, 1]), np.asarray(bucket[:, 5])
                )
        for bucket in self._buckets():
            if len(bucket):
                items = self._ids(vocab[1], bucket[:, 1])
                first = np.asarray(bucket[:, 5]) == first_line[items]
                item_cat[items[first]] = self._ids(vocab[2], bucket[first, 2])
        return item_cat

    # pass 2 ------------------------------------------------------------------------------------

    def _windows(self, vocab, item_cat: np.ndarray, cuts: dict) -> dict:
        T, ppu = self.opt.ts_length, self.opt.points_per_user
        n_items = len(vocab[1][0])
        writers = {
            s: {
                "items": NpyWriter(self.out / f"{s}.items.npy", np.int32, (T + 1,)),
                "categories": NpyWriter(self.out / f"{s}.categories.npy", np.int32, (T + 1,)),
                "users": NpyWriter(self.out / f"{s}.users.npy", np.int32),
                "labels": NpyWriter(self.out / f"{s}.labels.npy", np.int8),
                "times": NpyWriter(self.out / f"{s}.times.npy", np.int64),
            }
            for s in SPLITS
        }
        stats = {
            "users": 0,
            "users_too_short": 0,
            "negatives_dropped": 0,
            "events_with_other_category": 0,
        }
        try:
            for bucket in self._buckets():
                if len(bucket) == 0:
                    continue
                self._bucket_windows(
                    np.asarray(bucket), vocab, item_cat, cuts, n_items, T, ppu, writers, stats
                )
            splits = {}
            for s in SPLITS:
                files = {c: w.finish() for c, w in writers[s].items()}
                labels = np.load(self.out / f"{s}.labels.npy", mmap_mode="r", allow_pickle=False)
                splits[s] = {"rows": files["labels"]["rows"], "positives": int(np.count_nonzero(labels)),
                             "files": files}  # fmt: skip
        except BaseException:
            for ws in writers.values():
                for w in ws.values():
                    w.abort()
            raise
        self.counts.update(stats)
        return splits

    def _bucket_windows(
        self, bucket, vocab, item_cat, cuts, n_items, T, ppu, writers, stats
    ) -> None:
        seed = self.opt.seed
        order = np.lexsort((bucket[:, 5], bucket[:, 3], bucket[:, 0]))  # user, time, line
        ev = bucket[order]
        raw_user, ts, line = ev[:, 0], ev[:, 3], ev[:, 5]
        users = self._ids(vocab[0], raw_user)
        items = self._ids(vocab[1], ev[:, 1]).astype(np.int32)
        cats = self._ids(vocab[2], ev[:, 2]).astype(np.int32)
        stats["events_with_other_category"] += int(np.count_nonzero(item_cat[items] != cats))
        n = len(ev)
        starts = np.flatnonzero(np.concatenate(([True], raw_user[1:] != raw_user[:-1])))
        lengths = np.diff(np.append(starts, n))
        stats["users"] += len(starts)
        stats["users_too_short"] += int(np.count_nonzero(lengths <= T))
        pos_in_user = np.arange(n) - np.repeat(starts, lengths)
        split = np.searchsorted(
            [cuts["val"], cuts["test"]], ts, side="right"
        )  # 0 train, 1 val, 2 test
        cand = np.flatnonzero(pos_in_user >= T)
        # up to ppu targets per (user, split), chosen by a keyed hash of the event
        key = keyed_hash(seed, 1, raw_user[cand], line[cand])
        o = np.lexsort((key, split[cand], users[cand]))
        cand = cand[o]
        group = np.concatenate(
            ([True], (users[cand][1:] != users[cand][:-1]) | (split[cand][1:] != split[cand][:-1]))
        )
        group_start = np.maximum.accumulate(np.where(group, np.arange(len(cand)), 0))
        chosen = np.sort(cand[np.arange(len(cand)) - group_start < ppu])
        if len(chosen) == 0:
            return
        hist = chosen[:, None] + np.arange(-T, 1)[None, :]
        pos_items, pos_cats = items[hist], cats[hist]
        # negatives: an item this user had not touched up to the target, with its category
        pair = users.astype(np.int64) * n_items + items
        by_pair = np.lexsort((np.arange(n), pair))
        firsts = by_pair[np.concatenate(([True], pair[by_pair][1:] != pair[by_pair][:-1]))]
        touched, first_touch = pair[firsts], firsts  # sorted pairs, index of their first event
        neg = np.full(len(chosen), -1, dtype=np.int64)
        todo = np.arange(len(chosen))
        for attempt in range(_NEG_ATTEMPTS):
            draw = (keyed_hash(seed, 2, raw_user[chosen[todo]], line[chosen[todo]], attempt)
                    % np.uint64(n_items)).astype(np.int64)  # fmt: skip
            keys = users[chosen[todo]].astype(np.int64) * n_items + draw
            at = np.minimum(np.searchsorted(touched, keys), len(touched) - 1)
            free = (touched[at] != keys) | (first_touch[at] > chosen[todo])
            neg[todo[free]] = draw[free]
            todo = todo[~free]
            if len(todo) == 0:
                break
        stats["negatives_dropped"] += len(todo)
        has_neg = neg >= 0
        neg_items, neg_cats = pos_items[has_neg].copy(), pos_cats[has_neg].copy()
        neg_items[:, T] = neg[has_neg]
        neg_cats[:, T] = item_cat[neg[has_neg]]
        # interleave: each positive followed by its negative
        out_items = np.concatenate([pos_items, neg_items])
        out_cats = np.concatenate([pos_cats, neg_cats])
        out_users = np.concatenate([users[chosen], users[chosen][has_neg]]).astype(np.int32)
        out_labels = np.concatenate(
            [np.ones(len(chosen), np.int8), np.zeros(int(has_neg.sum()), np.int8)]
        )
        out_times = np.concatenate([ts[chosen], ts[chosen][has_neg]])
        out_split = np.concatenate([split[chosen], split[chosen][has_neg]])
        pair_of = np.concatenate([np.arange(len(chosen)), np.flatnonzero(has_neg)])
        inter = np.lexsort((1 - out_labels, pair_of))
        for s_index, s in enumerate(SPLITS):
            sel = inter[out_split[inter] == s_index]
            if len(sel) == 0:
                continue
            w = writers[s]
            w["items"].append(np.ascontiguousarray(out_items[sel]))
            w["categories"].append(np.ascontiguousarray(out_cats[sel]))
            w["users"].append(out_users[sel])
            w["labels"].append(out_labels[sel])
            w["times"].append(out_times[sel].astype(np.int64))

    def _write_meta(self, vocab, cuts, splits, started) -> None:
        o = self.opt
        meta = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "dataset": "taobao",
            "feature_names": FEATURE_NAMES,
            "table_sizes": [len(v) for v, _ in vocab],
            "num_dense": 1,
            "dense": "position of the step: j / (ts_length + 1) for step j = 0..ts_length (the target)",
            "ts_length": o.ts_length,
            "index_dtype": "int32",
            "splits": splits,
            "split_rule": "by the target's timestamp: train < cut_times.val <= val < cut_times.test <= test",
            "cut_times": cuts,
            "negatives": "uniform over the items the user had not touched up to the target, with the item's category",
            "id_order": "descending event count, ties by ascending raw id; vocab/<feature>.npy maps back",
            "settings": o.settings(),
            "raw": self.identity,
            "counts": self.counts,
            "bad_lines": {k: v for k, v in self.bad_counts.items() if v},
            "bad_line_examples": self.bad_examples,
            "made_by": {
                "tool": "data_pipeline.taobao",
                "python": platform.python_version(),
                "numpy": np.__version__,
                "buckets": self.num_buckets,
                "seconds": round(time.time() - started, 3),
            },
        }
        dm.write_json(self.out / "meta.json", meta)

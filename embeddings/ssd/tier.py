"""The SSD tier: embedding rows (weights and optimizer state) in files under `--scm-dir`, served
through a DRAM row cache, by global row id: a `RowStore` (embeddings/memory_tiers.py), so a faster tier
stages rows from it and writes them back exactly as it does with the host tier.

Files in the directory:
- `rows.dat`: every global row at a fixed stride in checksummed 4 KiB blocks (embeddings/ssd/file.py),
  sparse: a block is written the first time one of its rows is; a row's slot in it is given by
  the tier's layout (embeddings/ssd/layout.py: rows read together share blocks);
- `layout.npy`: that layout's profiled rows in slot order (absent: row-id order), checked
  against its record in tier.json when the tier opens;
- `journal.log`: the undo journal that makes a checkpoint a consistent point (embeddings/ssd/journal.py);
- `log.dat`: the write-back log of rows evicted since the last checkpoint (embeddings/ssd/log.py),
  started empty whenever the tier opens;
- `tier.json`: what the files hold (tables, width, optimizer, seed, layout), the tier's id, its
  owner (the training run's directory: `training_tier_owner` is what other users check) and its
  eras (below);
- `.lock`: held by the one process using the tier (hybrid_dlrm/common/lock.py).
Every block carries the tier's id (another tier's `rows.dat` is refused) and the era and
generation it was written in. An era ends at each rollback (`restore`), and tier.json lists the
generation each era was rolled back to: a block written in an earlier era at or after that point
should have been rolled back, so reading one means its pre-image was missing from the journal (a
journal cut short or replaced), and it is refused, never used. Every block is read before its
rows are used or patched, so the check costs nothing and misses no block.
A row never written has its initial value, `row_init.hashed_rows` (a pure function of seed,
table and row), and optimizer state zero; the map of written blocks is kept with each
checkpoint (`materialised`).

Reads: cached rows are copied from DRAM; the others are read from the log's newest copy or their
blocks (one 4 KiB read per block, on the I/O threads) or made from their initial value, and
admitted to the cache.
Writes go to the cache (dirty); rows the cache evicts, and rows it has no room for, are appended
to the write-back log (`log_rows` > 0), whose sweeps patch them into their blocks many to a block,
or are written to their blocks one by one (read, patched, checksummed, written; a block's pre-image
journaled first).
A write never waits for the tier (held by a prefetch's reads and the evictions its admissions
cause, on the Hotline worker): it is queued, and the tier's next holder stores the queued writes
before anything else, so every read sees every write made before it began; a read of rows all in
the last few writes is served from them (embeddings/ssd/writes.py).
`flush` writes every dirty and every logged row home; `prepare(generation)` flushes, fsyncs and
marks the point in the journal; `commit(generation)` makes it the journal's base once the
checkpoint is written; `restore(generation, materialised)` rolls the file back to a
checkpoint's point.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from data_pipeline.errors import unwritable_dir
from embeddings.config import SparseOptimizer, TableSpec
from embeddings.errors import ScmError, TierError
from embeddings.row_init import hashed_rows
from embeddings.row_layout import table_row_base
from embeddings.ssd.cache import RowCache
from embeddings.ssd.file import (
    BLOCK,
    PAYLOAD,
    BlockFile,
    aligned_blocks,
    block_rows,
    io_error,
    stamp,
    stamps,
)
from embeddings.ssd.journal import UndoJournal
from embeddings.ssd.layout import LAYOUT_FILE, RowLayout
from embeddings.ssd.log import BYTES_PER_ROW as LOG_MAP_BYTES_PER_ROW
from embeddings.ssd.log import LOG, WriteLog
from embeddings.ssd.writes import WriteQueue, joined
from hybrid_dlrm.common.atomic import write_json
from hybrid_dlrm.common.header import check_header
from hybrid_dlrm.common.lock import DirectoryLock, LockError

# version 3: rows at the slots of a layout (tier.json's `layout`); a version-2 tier is the identity
FORMAT, VERSION = "hybrid-dlrm/scm-tier", 3
MANIFEST, ROWS, JOURNAL = "tier.json", "rows.dat", "journal.log"
SERVING_MANIFEST = "serving.json"  # an artifact's serving copy (embeddings/ssd/serving.py)


def training_tier_owner(directory: str | Path) -> str | None:
    """What a directory holds that no other user may write over: the training tier of a run
    (described: its run directory and tier id), or None. The marker is `tier.json` (or a
    training tier's `journal.log`, should tier.json be lost)."""
    d = Path(directory)
    if (d / MANIFEST).is_file():
        try:
            m = json.loads((d / MANIFEST).read_text())
            owner, tid = str(m.get("owner") or "unknown"), str(m.get("tier_id", ""))[:16]
        except (OSError, ValueError, AttributeError):
            owner, tid = "unknown", "?"
        return f"the SSD tier of the training run in {owner} (tier {tid})"
    if (d / JOURNAL).is_file():
        return "a training run's SSD tier (its tier.json is missing)"
    return None


_WRITE_CHUNK = 1 << 16  # rows per flush chunk
WRITE_BLOCKS = 8192  # blocks per piece of a file write (32 MB, and their initial rows)


def _layout(tables: list[TableSpec], optimizer: SparseOptimizer, seed: int) -> dict:
    dim = tables[0].embedding_dim
    row_floats = dim + optimizer.state_floats(dim)
    rpb = PAYLOAD // (4 * row_floats)
    if rpb < 1:
        raise ScmError(f"scm tier: a row of {row_floats} floats does not fit a {BLOCK}-byte block")
    total = sum(t.num_embeddings for t in tables)
    return {
        "table_sizes": [t.num_embeddings for t in tables],
        "features": [t.feature_name for t in tables],
        "dim": dim,
        "optimizer": optimizer.kind,
        "row_floats": row_floats,
        "rows_per_block": rpb,
        "num_blocks": -(-total // rpb),
        "seed": seed,
        "init": "hashed",
    }


class ScmTier:
    """Rows by global id in an SSD file behind a DRAM row cache of `cache_bytes`."""

    name = "ssd"

    def __init__(
        self,
        directory: str | Path,
        tables: list[TableSpec],
        optimizer: SparseOptimizer,
        seed: int,
        cache_bytes: int,
        held: Callable[[torch.Tensor], torch.Tensor] | None = None,
        io: str = "direct",
        io_threads: int = 16,
        priority=None,
        resume: bool = False,
        owner: str = "",
        io_engine: str = "auto",
        io_depth: int = 64,
        layout: RowLayout | None = None,
        log_rows: int = 0,
    ) -> None:
        """`held(ids)`: bool per id, whether this tier is its home (None: every row's);
        `priority(gids)`: profile counts for the cache. `resume`: keep the files for a
        `restore`; if none follows before the first read or write, they are started afresh.
        `layout`: where a new tier puts each row (None: row-id order); an existing tier keeps
        the one it was written with. `log_rows`: the rows the write-back log holds before a
        sweep (its map's bytes come out of `cache_bytes`; 0: no log, evicted rows are patched
        into their blocks one by one; embeddings/ssd/log.py's `split_cache` sizes it)."""
        self.dir = Path(directory)
        self.tables, self.optimizer, self.seed = list(tables), optimizer, seed
        self.layout = _layout(self.tables, optimizer, seed)
        self.dim, self.row_floats = self.layout["dim"], self.layout["row_floats"]
        self.rpb, self.num_blocks = self.layout["rows_per_block"], self.layout["num_blocks"]
        self.sizes = self.layout["table_sizes"]
        self.row_base = table_row_base(self.sizes)
        self.total_rows = sum(self.sizes)
        self._new_layout = layout if layout is not None else RowLayout.identity(self.total_rows)
        if self._new_layout.total_rows != self.total_rows:
            raise ScmError(
                f"scm tier: a layout of {self._new_layout.total_rows} rows for tables of "
                f"{self.total_rows}"
            )
        self.row_layout = self._new_layout
        self.held = held
        self.io, self.io_threads, self.owner = io, io_threads, owner
        self.io_engine, self.io_depth = io_engine, io_depth
        self.backend = f"ssd({io})"
        self.row_bytes = 4 * self.row_floats
        # slots beyond the tier's rows would hold nothing and only cost their allocation
        self.log_rows = log_rows
        room = max(0, int(cache_bytes) - log_rows * LOG_MAP_BYTES_PER_ROW)
        capacity = min(room // self.row_bytes, self.total_rows)
        self.cache = RowCache(self.total_rows, self.row_floats, capacity, priority)
        self.log: WriteLog | None = None
        self._lock = threading.RLock()
        self._depth = 0  # nesting of `_locked` in the thread holding the lock
        self.writes = WriteQueue(self.row_floats)  # not stored yet, and the last few
        self.queue_writes = True  # False: a write waits for the tier (the first round's way)
        self.lock_wait_s = 0.0  # time callers waited for the tier's lock
        self.journal = UndoJournal(self.dir / JOURNAL)
        self.generation = 0
        self._journaled = np.zeros(self.num_blocks, dtype=bool)
        self.counts = dict.fromkeys(
            ("rows_requested", "rows_read", "rows_initial", "blocks_read", "blocks_rmw", "rows_written",
             "blocks_written", "rows_direct_writes", "preimage_blocks", "rows_recent"), 0
        )  # fmt: skip
        self.io_s = 0.0  # time in file reads and writes (on whichever thread)
        self.era, self.restores = 0, []  # this era; the generation each earlier one ended at
        self._take_directory()
        self._pending = resume and (self.dir / MANIFEST).is_file()
        if self._pending:
            self._open_existing()
        else:
            self._create()

    # --- the lock and the queue of writes -------------------------------------------------------

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the tier, the queued writes stored first (the outermost holder stores them)."""
        if not self._lock.acquire(blocking=False):
            t0 = time.perf_counter()
            self._lock.acquire()
            self.lock_wait_s += time.perf_counter() - t0
        self._depth += 1
        try:
            if self._depth == 1:
                self._store_queued()
            yield
        finally:
            self._depth -= 1
            self._lock.release()

    def _store_queued(self) -> None:
        while queued := self.writes.take():
            for ids, parts in queued:
                self._store(ids, joined(parts))

    # --- files --------------------------------------------------------------------------------------

    def _take_directory(self) -> None:
        """The directory, made and locked for this process, checked before a byte is written:
        tier files without their tier.json, or an artifact's serving copy, are not ours to
        start afresh over."""
        if problem := unwritable_dir(self.dir):
            raise ScmError(f"--scm-dir: {problem}")
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ScmError(f"--scm-dir: {self.dir} cannot be made ({e.strerror or e})") from None
        if (self.dir / SERVING_MANIFEST).exists():
            raise ScmError(
                f"--scm-dir {self.dir}: holds an artifact's serving copy (serving.json), not a "
                "training tier; give this run another directory"
            )
        if not (self.dir / MANIFEST).exists():
            found = [n for n in (ROWS, JOURNAL, LOG) if (self.dir / n).exists()]
            if found:
                raise ScmError(
                    f"--scm-dir {self.dir}: holds {' and '.join(found)} but no {MANIFEST}: a tier "
                    "whose description was lost is not started afresh over; restore "
                    f"{MANIFEST}, or delete the directory to start a new tier"
                )
        try:
            self._dir_lock = DirectoryLock(self.dir).acquire("--scm-dir")
        except LockError as e:
            raise ScmError(str(e)) from None

    def _write_manifest(self) -> None:
        manifest = {"format": FORMAT, "version": VERSION, "tier_id": self.tier_id.hex(),
                    "owner": self.owner, "restores": self.restores, **self.layout,
                    "row_layout": self._layout_record}  # fmt: skip
        try:
            write_json(self.dir / MANIFEST, manifest)
        except OSError as e:
            raise io_error(e, self.dir / MANIFEST, "the tier's description") from None

    def _create(self) -> None:
        if getattr(self, "file", None) is not None:
            self.file.close()
        self._check_owner()
        self.tier_id = uuid.uuid4().bytes
        self.era, self.restores = 0, []
        self.row_layout = self._new_layout
        if self.row_layout.num_placed:  # written before the description that names it
            try:
                self._layout_record = self.row_layout.save(self.dir)
            except OSError as e:
                raise io_error(e, self.dir / LAYOUT_FILE, "the tier's row layout") from None
        else:
            self._layout_record = {"kind": "identity"}
            (self.dir / LAYOUT_FILE).unlink(missing_ok=True)  # an earlier tier's, now unused
        self._write_manifest()
        self.file = BlockFile(
            self.dir / ROWS, self.num_blocks, self.io, self.io_threads, True, self.io_engine,
            self.io_depth, self.tier_id,
        )  # fmt: skip
        self.materialised = np.zeros(self.num_blocks, dtype=bool)
        self._open_log()
        self.generation = 0
        self._journaled[:] = False
        self.writes.forget()
        self.journal.start(self.tier_id, 0)
        self._pending = False

    def _check_owner(self) -> None:
        path = self.dir / MANIFEST
        if not path.is_file():
            return
        try:
            old = json.loads(path.read_text()).get("owner", "")
        except (json.JSONDecodeError, OSError, AttributeError):
            old = ""
        if old and self.owner and Path(old).resolve() != Path(self.owner).resolve():
            raise ScmError(
                f"--scm-dir {self.dir}: holds the tier of the run in {old}; give this run "
                "another directory (or delete that one)"
            )

    def _open_existing(self) -> None:
        path = self.dir / MANIFEST
        try:
            manifest = json.loads(path.read_text())
        except (json.JSONDecodeError, OSError) as e:
            raise ScmError(f"{path}: not a readable tier manifest ({e})") from None
        check_header(manifest, path, format=FORMAT, versions=(2, VERSION), kind="SSD tier",
                     what="hybrid-dlrm SSD tier", error=ScmError)  # fmt: skip
        stored = {k: manifest.get(k) for k in self.layout}
        if stored != self.layout:
            diff = [k for k in self.layout if stored[k] != self.layout[k]]
            raise ScmError(
                f"{path}: the tier was made for other tables or settings ({', '.join(diff)} differ)"
            )
        self.tier_id = bytes.fromhex(manifest["tier_id"])
        restores = manifest.get("restores", [])
        if not isinstance(restores, list) or not all(isinstance(g, int) for g in restores):
            raise ScmError(f"{path}: `restores` is not a list of generations")
        self.restores, self.era = restores, len(restores)
        self._layout_record = manifest.get("row_layout") or {"kind": "identity"}
        if not isinstance(self._layout_record, dict):
            raise ScmError(f"{path}: `row_layout` is not a layout record")
        self.row_layout = RowLayout.open(self.dir, self._layout_record, self.total_rows)
        self.file = BlockFile(
            self.dir / ROWS, self.num_blocks, self.io, self.io_threads, False, self.io_engine,
            self.io_depth, self.tier_id,
        )  # fmt: skip
        self.materialised = np.zeros(self.num_blocks, dtype=bool)
        self._open_log()

    def _open_log(self) -> None:
        """The write-back log, empty (what it held before is not the tier's: every checkpoint
        and restore starts from the home blocks alone)."""
        if self.log is not None:
            self.log.close()
            self.log = None
        if self.log_rows:
            self.log = WriteLog(
                self.dir / LOG, self.log_rows, self.rpb, self.row_floats, self.tier_id,
                self._slots, self._write_file, io=self.io, threads=self.io_threads,
                engine=self.io_engine, depth=self.io_depth,
            )  # fmt: skip
        else:
            (self.dir / LOG).unlink(missing_ok=True)  # an earlier run's, now unused

    def _ready(self) -> None:
        if self._pending:  # resumed without a checkpoint of this tier: start it afresh
            self._create()

    def restore(self, generation: int, tier_id: bytes, materialised: np.ndarray) -> None:
        """Roll the files back to a checkpoint's point (its generation and written-block map)."""
        with self._locked():
            if not self._pending and generation == self.generation and tier_id == self.tier_id:
                self.materialised = materialised.copy()  # loading the state we are at
                return
            if tier_id != self.tier_id:
                raise ScmError(
                    f"{self.dir}: this tier ({self.tier_id.hex()}) is not the one the checkpoint "
                    f"was written with ({tier_id.hex()})"
                )
            if materialised.shape != (self.num_blocks,):
                raise ScmError(f"{self.dir}: the checkpoint's block map has the wrong size")
            if self.journal.tier_id() != self.tier_id:
                raise ScmError(f"{self.journal.path}: the journal belongs to another tier")
            blocks, images = self.journal.rollback_images(generation)
            if blocks.size:  # one write per image, newest first: a block's oldest image wins
                buf = aligned_blocks(1)
                for b, img in zip(blocks.tolist(), images):
                    buf[0] = img
                    os.pwrite(self.file.fd, memoryview(buf.reshape(-1)), b * BLOCK)
                self.file.fsync()
            self.materialised = materialised.copy()
            self.generation = generation
            # a new era: blocks the old one wrote at or after `generation` are rolled back now,
            # so one read later means the journal lacked its pre-image (recorded before any write)
            self.restores = [*self.restores, generation]
            self.era = len(self.restores)
            self._write_manifest()
            self._journaled[:] = False
            self.journal.start(self.tier_id, generation)
            written = np.flatnonzero(self.materialised)
            if written.size:  # another tier's rows.dat is named now, not at its first read
                self._read_blocks(written[:1])
            self.cache = RowCache(
                self.total_rows, self.row_floats, self.cache.capacity, self.cache.priority
            )
            if self.log is not None:
                self.log.reset()
            self.writes.forget()
            self._pending = False

    def prepare(self) -> int:
        """Flush every dirty row, fsync, and mark the next generation in the journal."""
        with self._locked():
            self._ready()
            self.flush()
            self.file.fsync()
            self.generation += 1
            self.journal.prepare(self.generation)
            self._journaled[:] = False
            return self.generation

    def commit(self, generation: int) -> None:
        """The checkpoint of `generation` is written: the journal restarts from it."""
        with self._locked():
            self.journal.start(self.tier_id, generation)

    def close(self) -> None:
        self.journal.close()
        self.file.close()
        if self.log is not None:
            self.log.close()
        self._dir_lock.release()

    # --- rows ----------------------------------------------------------------------------------

    def holds(self, ids: torch.Tensor) -> torch.Tensor:
        if self.held is None:
            return torch.ones(ids.shape, dtype=torch.bool)
        return self.held(ids)

    def _check(self, ids: torch.Tensor) -> None:
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.total_rows):
            raise TierError(f"ssd tier: row ids outside 0..{self.total_rows - 1}")
        if self.held is not None and ids.numel():
            bad = torch.nonzero(~self.held(ids))
            if bad.numel():
                gid = int(ids[bad[0, 0]])
                t = int(torch.bucketize(torch.tensor(gid), self.row_base, right=True)) - 1
                raise TierError(
                    f"ssd tier: row {gid - int(self.row_base[t])} of table {self.tables[t].name} "
                    "is not held here (its plan puts it in another tier)"
                )

    def split_rows(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return rows[:, : self.dim].contiguous(), self.optimizer.state_from_rows(rows[:, self.dim :])

    @torch.no_grad()
    def read_rows(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rows `ids` (unique int64 global ids) and their state; admitted to the cache."""
        recent = self.writes.recent(ids) if self.queue_writes else None
        if recent is not None:
            self.counts["rows_recent"] += ids.numel()
            return self.split_rows(recent)
        with self._locked():
            self._ready()
            self._check(ids)
            self.cache.next_access()
            out = torch.empty(ids.numel(), self.row_floats)
            self.counts["rows_requested"] += ids.numel()
            if self.cache.capacity:
                slots = self.cache.lookup(ids)
                hit = slots >= 0
                out[hit] = self.cache.data[slots[hit]]
                miss = torch.nonzero(~hit).squeeze(1)
            else:
                self.cache.misses += ids.numel()
                miss = torch.arange(ids.numel())
            if miss.numel():
                gids = ids[miss]
                rows = self._read_file(gids)
                out[miss] = rows
                if self.cache.capacity:
                    self._admit(gids, rows, dirty=False)
            return self.split_rows(out)

    @torch.no_grad()
    def peek_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """[n, row floats] of `ids` without touching the cache's order or admitting (exports)."""
        with self._locked():
            self._ready()
            out = torch.empty(ids.numel(), self.row_floats)
            slots = self.cache.slots(ids) if self.cache.capacity else torch.full_like(ids, -1)
            hit = slots >= 0
            if hit.any():
                out[hit] = self.cache.data[slots[hit]]
            miss = torch.nonzero(~hit).squeeze(1)
            if miss.numel():
                out[miss] = self._read_file(ids[miss], count=False)
            return out

    @torch.no_grad()
    def write_rows(
        self,
        ids: torch.Tensor,
        weights: torch.Tensor,
        state: torch.Tensor | None,
        given: bool = False,
    ) -> None:
        """Store rows `ids` (unique) back: into the cache (dirty), the rest into the file.
        `given`: the caller gives the tensors up (`RowStore.give_rows`), so they are queued as
        they are, weights and state apart: the step's write-back then costs its thread no copy,
        and whoever stores the write (the staging worker) joins them."""
        n = ids.numel()
        parts = (weights.reshape(n, self.dim),)
        if state is not None:
            parts = (*parts, state.reshape(n, -1))
        self._check(ids)
        if not given:  # the caller may reuse its tensors: keep copies (`joined` of two is one)
            ids = ids.clone()
            parts = (joined(parts) if len(parts) > 1 else parts[0].clone(),)
        if not self.queue_writes:
            with self._locked():
                self._store(ids, joined(parts))
        if self.writes.put(ids, parts, queue=self.queue_writes):
            with self._locked():  # the queue is full: store it now
                pass

    def _store(self, ids: torch.Tensor, rows: torch.Tensor) -> None:
        """`write_rows` with the tier held."""
        self._ready()
        if not self.cache.capacity:
            self._write_file(ids, rows)
            return
        slots = self.cache.slots(ids)
        hit = slots >= 0
        self.cache.data[slots[hit]] = rows[hit]
        self.cache.dirty[slots[hit]] = True
        miss = torch.nonzero(~hit).squeeze(1)
        if miss.numel():
            self._admit(ids[miss], rows[miss], dirty=True)

    def _admit(self, gids: torch.Tensor, rows: torch.Tensor, dirty: bool) -> None:
        slots, evicted = self.cache.admit(gids, dirty)
        if evicted.numel():  # write the evicted dirty rows out before their slots are reused
            self._write_back(self.cache.evicted_gids(), self.cache.data[evicted].clone())
        k = slots.numel()
        self.cache.data[slots] = rows[:k]
        if dirty and k < gids.numel():  # no room: straight to the file
            self.counts["rows_direct_writes"] += gids.numel() - k
            self._write_back(gids[k:], rows[k:])

    def _write_back(self, gids: torch.Tensor, rows: torch.Tensor) -> None:
        """Rows leaving DRAM: appended to the log, or patched into their blocks."""
        if self.log is None:
            self._write_file(gids, rows)
        else:
            self.log.append(gids, rows)

    def flush(self) -> None:
        """Every dirty cached row and every logged row into its block (the cache keeps its rows,
        clean; the log is empty)."""
        with self._locked():
            if not self.cache.capacity:
                return
            slots = torch.nonzero(self.cache.dirty).squeeze(1)
            gids = self.cache.gid[slots]
            where = slots  # >= 0: a cache slot; < 0: -1 - the row's log slot
            if self.log is not None:
                lg, ls = (torch.from_numpy(a) for a in self.log.map.items())
                older = torch.isin(lg, gids)  # the cache's dirty copy is newer
                gids, where = torch.cat([gids, lg[~older]]), torch.cat([where, -1 - ls[~older]])
            if not gids.numel():
                return
            order = torch.argsort(self._slots(gids))  # the file's order: sequential writes
            gids, where = gids[order], where[order]
            for a in range(0, gids.numel(), _WRITE_CHUNK):
                w = where[a : a + _WRITE_CHUNK]
                rows = torch.empty(w.numel(), self.row_floats)
                cached = w >= 0
                rows[cached] = self.cache.data[w[cached]]
                if not bool(cached.all()):
                    rows[~cached] = self.log.read(-1 - w[~cached])[0]
                self._write_file(gids[a : a + _WRITE_CHUNK], rows)
            self.cache.dirty[slots] = False
            if self.log is not None:
                self.log.reset()

    def fill(self, chunk_blocks: int = 8192) -> int:
        """Write every block not yet written with its initial rows (sequential writes), as a
        long run's tier looks: then every cache miss is a real read. Returns blocks written."""
        with self._locked():
            self._ready()
            todo = np.flatnonzero(~self.materialised)
            for a in range(0, todo.size, chunk_blocks):
                ub = todo[a : a + chunk_blocks]
                buf = aligned_blocks(ub.size)
                self._rows_view(buf)[:] = self._initial_blocks(ub)
                self.file.write(ub, stamp(buf, self.era, self.generation))
                self.materialised[ub] = True
            self.file.fsync()
            return int(todo.size)

    # --- the file ------------------------------------------------------------------------------

    def _initial(self, gids: torch.Tensor) -> torch.Tensor:
        """Initial rows: hashed weights, zero optimizer state."""
        out = torch.zeros(gids.numel(), self.row_floats)
        table = (torch.bucketize(gids, self.row_base, right=True) - 1).numpy()
        rows = gids.numpy() - self.row_base.numpy()[table]
        sizes = np.asarray(self.sizes)[table]
        out[:, : self.dim] = hashed_rows(rows, self.dim, table, sizes, self.seed)
        return out

    def _initial_blocks(self, blocks: np.ndarray) -> torch.Tensor:
        """[n, rows per block, row floats]: the initial rows of blocks never written (the rows
        at their slots; zeros past the last row)."""
        first = blocks.astype(np.int64) * self.rpb
        slots = (first[:, None] + np.arange(self.rpb)[None, :]).reshape(-1)
        ok = slots < self.total_rows
        init = torch.zeros(slots.size, self.row_floats)
        init[torch.from_numpy(ok)] = self._initial(
            torch.from_numpy(self.row_layout.rows(slots[ok]))
        )
        return init.view(blocks.size, self.rpb, self.row_floats)

    def _slots(self, gids: torch.Tensor) -> torch.Tensor:
        """Each row's slot in the file (its block: slot // rows per block)."""
        if not self.row_layout.num_placed:
            return gids
        return torch.from_numpy(self.row_layout.slots(gids.numpy()))

    def _rows_view(self, buf: np.ndarray) -> torch.Tensor:
        return block_rows(buf, self.rpb, self.row_floats)

    def _read_blocks(self, blocks: np.ndarray) -> np.ndarray:
        """Blocks as the file holds them, verified (checksum, index, tier) and each from the
        tier's present: written in this era, or before the point its era was rolled back to."""
        buf = self.file.read(blocks)
        era, gen = stamps(buf)
        ends = np.asarray([*self.restores, 0], dtype=np.int64)[np.minimum(era, self.era)]
        stale = np.flatnonzero((era > self.era) | ((era < self.era) & (gen >= ends)))
        if stale.size:
            i = int(stale[0])
            b, e = int(blocks[i]), int(era[i])
            raise ScmError(
                f"{self.journal.path}: the journal was cut short or replaced: block {b} of "
                f"{ROWS} was written at generation {int(gen[i])} of era {e}, after the point "
                f"the tier was rolled back to, and no pre-image of it was there; the tier's rows "
                "cannot be trusted (start the run afresh)"
            )
        return buf

    def _read_file(self, gids: torch.Tensor, count: bool = True) -> torch.Tensor:
        """Rows `gids` from the file: the log's newest copy where it has one, else the row's block
        (or its initial value where the block was never written)."""
        if self.log is None:
            return self._read_home(gids, count)
        at = self.log.locate(gids)
        logged = at >= 0
        if not bool(logged.any()):
            return self._read_home(gids, count)
        t0 = time.perf_counter()
        out = torch.empty(gids.numel(), self.row_floats)
        out[logged], blocks = self.log.read(at[logged])
        if count:
            self.counts["blocks_read"] += blocks
            self.counts["rows_read"] += int(logged.sum())
        self.io_s += time.perf_counter() - t0
        if not bool(logged.all()):
            out[~logged] = self._read_home(gids[~logged], count)
        return out

    def _read_home(self, gids: torch.Tensor, count: bool = True) -> torch.Tensor:
        t0 = time.perf_counter()
        slots = self._slots(gids)
        blocks = (slots // self.rpb).numpy()
        written = self.materialised[blocks]
        out = torch.empty(gids.numel(), self.row_floats)
        fresh = torch.from_numpy(np.flatnonzero(~written))
        if fresh.numel():
            out[fresh] = self._initial(gids[fresh])
        on_disk = np.flatnonzero(written)
        if on_disk.size:
            ub, pos = np.unique(blocks[on_disk], return_inverse=True)
            buf = self._read_blocks(ub)
            rows = self._rows_view(buf)
            at = torch.from_numpy(on_disk)
            out[at] = rows[torch.from_numpy(pos), slots[at] % self.rpb]
            if count:
                self.counts["blocks_read"] += ub.size
                self.counts["rows_read"] += on_disk.size
        if count:
            self.counts["rows_initial"] += fresh.numel()
        self.io_s += time.perf_counter() - t0
        return out

    def _write_file(self, gids: torch.Tensor, rows: torch.Tensor) -> None:
        """Rows into their blocks, `WRITE_BLOCKS` blocks at a time: in one piece a batch of
        evictions (each row in a block of its own) takes 4 KiB per row at once, and more for the
        new blocks' initial rows, outside any DRAM budget (docs/measurements/scm.md)."""
        blocks = self._slots(gids) // self.rpb
        ub = torch.unique(blocks)
        if ub.numel() <= WRITE_BLOCKS:
            return self._write_blocks(gids, rows)
        piece = torch.bucketize(
            blocks, ub[::WRITE_BLOCKS].contiguous(), right=True
        )  # a block's rows together
        for p in torch.unique(piece).tolist():
            sel = torch.nonzero(piece == p).squeeze(1)
            self._write_blocks(gids[sel], rows[sel])

    def _write_blocks(self, gids: torch.Tensor, rows: torch.Tensor) -> None:
        """Rows into their blocks: read-modify-write, a block's pre-image journaled first."""
        t0 = time.perf_counter()
        slots = self._slots(gids)
        blocks = (slots // self.rpb).numpy()
        ub, pos = np.unique(blocks, return_inverse=True)
        written = self.materialised[ub]
        buf = aligned_blocks(ub.size)
        view = self._rows_view(buf)
        old = np.flatnonzero(written)
        if old.size:
            buf[old] = self._read_blocks(ub[old])
            self.counts["blocks_rmw"] += old.size
        new = np.flatnonzero(~written)
        if new.size:  # a block's first write: its other rows keep their initial values
            view[torch.from_numpy(new)] = self._initial_blocks(ub[new])
        need = old[~self._journaled[ub[old]]]
        if need.size:
            self.journal.add_preimages(ub[need], buf[need])
            self._journaled[ub[need]] = True
            self.counts["preimage_blocks"] += need.size
        view[torch.from_numpy(pos), slots % self.rpb] = rows
        self.file.write(ub, stamp(buf, self.era, self.generation))
        self.materialised[ub] = True
        self.counts["rows_written"] += gids.numel()
        self.counts["blocks_written"] += ub.size
        self.io_s += time.perf_counter() - t0

    # --- counters ------------------------------------------------------------------------------

    def counters(self) -> dict:
        c, cache = self.counts, self.cache
        p50, p99 = self.file.latency_percentiles_us()
        bytes_read = c["blocks_read"] * BLOCK
        used = c["rows_read"] * self.row_bytes
        lookups = cache.hits + cache.misses
        return {
            "scm_cache_hits": cache.hits,
            "scm_cache_misses": cache.misses,
            "scm_cache_hit_rate": round(cache.hits / lookups, 4) if lookups else None,
            "scm_cache_rows": cache.used,
            "scm_cache_evictions": cache.evictions,
            "scm_rows_read": c["rows_read"],
            "scm_rows_initial": c["rows_initial"],
            "scm_bytes_read": bytes_read,
            "scm_read_amplification": round(bytes_read / used, 2) if used else None,
            "scm_blocks_read": c["blocks_read"],
            "scm_rows_per_block_read": (
                round(c["rows_read"] / c["blocks_read"], 3) if c["blocks_read"] else None
            ),
            "scm_rows_written": c["rows_written"],
            "scm_writeback_bytes": c["blocks_written"] * BLOCK,
            "scm_writeback_read_bytes": c["blocks_rmw"] * BLOCK,  # blocks read to patch rows in
            "scm_preimage_bytes": c["preimage_blocks"] * BLOCK,
            "scm_io_p50_us": p50,
            "scm_io_p99_us": p99,
            "scm_queue_depth": self.file.queue_depth(),
            "scm_reads_per_s_while_reading": (
                round(self.file.blocks_read / self.file.wall_s) if self.file.wall_s else None
            ),
            "scm_io_s": round(self.io_s, 4),
            **self._log_counters(),
            "scm_lock_wait_s": round(self.lock_wait_s, 4),
            "scm_rows_from_recent_writes": c["rows_recent"],
            "scm_disk_bytes": self.file.disk_bytes()
            + (self.log.file.disk_bytes() if self.log else 0),
            "scm_logical_bytes": self.num_blocks * BLOCK,
        }

    def _log_counters(self) -> dict:
        if self.log is None:
            return {"scm_log_rows": 0}
        c = self.log.counts
        return {
            "scm_log_rows": self.log_rows,
            "scm_log_rows_written": c["rows_logged"],
            "scm_log_blocks_written": c["blocks_logged"],
            "scm_log_rows_read": c["rows_read"],
            "scm_log_sweeps": c["sweeps"],
            "scm_log_rows_swept": c["rows_swept"],
            "scm_log_rows_superseded": c["rows_superseded"],
        }

    def dram_bytes(self) -> int:
        """The tier's DRAM: cached rows plus the cache's, the log's and the block map's
        bookkeeping."""
        return (
            self.cache.capacity * self.row_bytes
            + self.cache.bookkeeping_bytes()
            + (self.log.nbytes() if self.log is not None else 0)
            + 2 * self.num_blocks
            + self.row_layout.nbytes()
        )

"""Serving an inference artifact's quantized tables from the SSD tier: tables larger than memory
are scored through a DRAM row cache (a predictor opened with `--scm-dir`).

What is on the tier is the artifact's own rows (embeddings/quantized.py's layout: uint8 rows of
`row_bytes(dim, precision)` bytes, int8 at dim 64 is 68 bytes against 256 for fp32), not float
rows: they are what the artifact holds and what the in-memory predictor looks up, so serving
them from a file changes where the bytes are, never the numbers, and a 4 KiB block or a byte of
cache holds 3.8x more rows at int8 than at fp32.

Files in `--scm-dir`:
- `rows.dat`: each table's rows at its own stride in the training tier's checksummed 4 KiB blocks
  (embeddings/ssd/file.py: `floor(4064 / row bytes)` rows a block, rows never straddling blocks;
  block index, magic and CRC-32 in every block's trailer), tables back to back, each starting on a
  block boundary. Every block read is verified: a damaged block is an ScmError naming the file,
  block and offset, never numbers.
- `serving.json`: the layout and the SHA-256 of each table file of the artifact it was copied
  from, written last (renamed into place): a directory without it, or whose layout or hashes
  differ from the artifact opened, is copied again (streamed from the `.npy` files, never whole in
  memory); one that matches is served as it is (a warm start skips the copy).
Reads go through a row cache (`RowCache` of embeddings/ssd/cache.py, least recently used rows out;
the rows of the last few batches stay) in front of `--scm-io-threads` O_DIRECT reads.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from embeddings.collection import EmbeddingLookup
from embeddings.config import SparseOptimizer, TableSpec
from embeddings.errors import ScmError
from embeddings.quantized import QuantizedEmbeddingBagCollection, dequantize_rows, row_bytes
from embeddings.row_layout import table_row_base
from embeddings.ssd.cache import RowCache
from embeddings.ssd.file import BLOCK, PAYLOAD, BlockFile, aligned_blocks
from embeddings.ssd.tier import training_tier_owner
from embeddings.transfer_stats import no_transfer_counters
from hybrid_dlrm.common.atomic import write_json
from hybrid_dlrm.common.header import check_header

FORMAT, VERSION = "hybrid-dlrm/scm-serving", 2  # 2: the 32-byte block trailer
MANIFEST, ROWS = "serving.json", "rows.dat"
_COPY_BLOCKS = 4096  # blocks written at once while copying a table in (16 MiB)


def _npy_data_offset(path: Path) -> int:
    """Where a .npy file's array data starts (after its header)."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read = {(1, 0): np.lib.format.read_array_header_1_0}.get(
            version, np.lib.format.read_array_header_2_0
        )
        read(f)
        return f.tell()


class ServingTier:
    """Read-only rows of quantized tables (uint8, a width per table) by global row id."""

    def __init__(
        self,
        directory: str | Path,
        tables: list[TableSpec],
        precisions: list[str],
        sources: list[tuple[Path, str]],
        cache_bytes: int,
        io: str = "direct",
        io_threads: int = 16,
    ) -> None:
        """`sources[t]`: table t's `.npy` file in the artifact (verified by the caller) and its
        SHA-256, which names what the tier holds."""
        self.dir = Path(directory)
        self.tables, self.precisions = list(tables), list(precisions)
        self.sizes = [t.num_embeddings for t in tables]
        self.widths = [row_bytes(t.embedding_dim, p) for t, p in zip(tables, precisions)]
        if max(self.widths) > PAYLOAD:
            raise ScmError(f"--scm-dir: a row of {max(self.widths)} bytes does not fit a block")
        self.rpb = [PAYLOAD // w for w in self.widths]
        blocks = [-(-n // r) for n, r in zip(self.sizes, self.rpb)]
        self.first_block = [0, *np.cumsum(blocks)[:-1].tolist()]
        self.num_blocks = int(sum(blocks))
        self.row_base = table_row_base(self.sizes)
        self.total_rows = sum(self.sizes)
        self.width = max(self.widths)
        self.layout = {
            "tables": [t.name for t in tables], "sizes": self.sizes, "precisions": self.precisions,
            "row_bytes": self.widths, "rows_per_block": self.rpb, "num_blocks": self.num_blocks,
            "sources_sha256": [sha for _, sha in sources],
        }  # fmt: skip
        if owner := training_tier_owner(self.dir):  # never copied over: that run could not resume
            raise ScmError(f"--scm-dir {self.dir}: holds {owner}; give serving another directory")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.copied_blocks = 0
        if self._matches():
            self.file = BlockFile(self.dir / ROWS, self.num_blocks, io, io_threads)
        else:
            self._copy_in(sources, io, io_threads)
        # capped at the rows that exist: a slot no row can fill is memory for nothing
        capacity = min(max(0, int(cache_bytes) // self.width), self.total_rows)
        self.cache = RowCache(self.total_rows, 0, capacity)  # bookkeeping; the bytes are here:
        self.data = torch.zeros(capacity, self.width, dtype=torch.uint8)
        self._lock = threading.Lock()
        self.rows_read = self.blocks_read = 0

    # --- the copy from the artifact ----------------------------------------------------------

    def _matches(self) -> bool:
        try:
            manifest = json.loads((self.dir / MANIFEST).read_text())
            check_header(manifest, self.dir / MANIFEST, format=FORMAT, versions=(VERSION,))
        except (OSError, ValueError):  # FormatError is one: a copy of another format is redone
            return False
        return manifest.get("layout") == self.layout and (self.dir / ROWS).is_file()

    def _copy_in(self, sources: list[tuple[Path, str]], io: str, io_threads: int) -> None:
        (self.dir / MANIFEST).unlink(missing_ok=True)  # until the copy is complete
        self.file = BlockFile(self.dir / ROWS, self.num_blocks, io, io_threads, create=True)
        for t, (path, _) in enumerate(sources):
            w, rpb, n = self.widths[t], self.rpb[t], self.sizes[t]
            with open(path, "rb") as f:
                f.seek(_npy_data_offset(path))
                for first in range(0, -(-n // rpb), _COPY_BLOCKS):
                    rows = min(n - first * rpb, _COPY_BLOCKS * rpb)
                    raw = np.frombuffer(f.read(rows * w), dtype=np.uint8)
                    if raw.size != rows * w:
                        raise ScmError(f"{path}: shorter than its table ({n} rows of {w} bytes)")
                    k = -(-rows // rpb)
                    buf = aligned_blocks(k)
                    padded = np.zeros(k * rpb * w, dtype=np.uint8)
                    padded[: raw.size] = raw
                    buf[:, : rpb * w] = padded.reshape(k, rpb * w)
                    self.file.write(self.first_block[t] + first + np.arange(k), buf)
                    self.copied_blocks += k
        self.file.fsync()
        manifest = {"format": FORMAT, "version": VERSION, "layout": self.layout}
        write_json(self.dir / MANIFEST, manifest)

    # --- rows --------------------------------------------------------------------------------

    def read_rows(self, gids: torch.Tensor) -> torch.Tensor:
        """uint8 [n, max width] rows of `gids` (unique; table t's bytes in the first widths[t]
        columns), through the row cache."""
        with self._lock:
            self.cache.next_access()
            out = torch.zeros(gids.numel(), self.width, dtype=torch.uint8)
            if self.cache.capacity:
                slots = self.cache.lookup(gids)
                hit = slots >= 0
                out[hit] = self.data[slots[hit]]
                miss = torch.nonzero(~hit).squeeze(1)
            else:
                self.cache.misses += gids.numel()
                miss = torch.arange(gids.numel())
            if miss.numel():
                rows = self.read_uncached(gids[miss])
                out[miss] = rows
                if self.cache.capacity:
                    slots, _ = self.cache.admit(gids[miss], dirty=False)
                    self.data[slots] = rows[: slots.numel()]
            return out

    def read_uncached(self, gids: torch.Tensor) -> torch.Tensor:
        """`read_rows` from the file alone (the cache neither used nor changed)."""
        g = gids.numpy()
        t = np.searchsorted(self.row_base.numpy(), g, side="right") - 1
        local = g - self.row_base.numpy()[t]
        rpb, width = np.asarray(self.rpb)[t], np.asarray(self.widths)[t]
        blocks = np.asarray(self.first_block)[t] + local // rpb
        ub, pos = np.unique(blocks, return_inverse=True)
        buf = self.file.read(ub).reshape(-1)
        start = pos * BLOCK + (local % rpb) * width
        cols = np.arange(self.width)
        idx = np.minimum(start[:, None] + cols[None, :], buf.size - 1)
        rows = buf[idx]
        rows[cols[None, :] >= width[:, None]] = 0
        self.rows_read += g.size
        self.blocks_read += ub.size
        return torch.from_numpy(rows)

    def counters(self) -> dict:
        c = self.cache
        lookups = c.hits + c.misses
        p50, p99 = self.file.latency_percentiles_us()
        return {
            "scm_cache_hits": c.hits,
            "scm_cache_misses": c.misses,
            "scm_cache_hit_rate": round(c.hits / lookups, 4) if lookups else None,
            "scm_rows_read": self.rows_read,
            "scm_bytes_read": self.blocks_read * BLOCK,
            "scm_io_p50_us": p50,
            "scm_io_p99_us": p99,
            "scm_copied_blocks": self.copied_blocks,
        }

    def close(self) -> None:
        self.file.close()


class ScmQuantizedEmbeddingBagCollection(EmbeddingLookup):
    """`QuantizedEmbeddingBagCollection`'s lookups (sum-pooled, dequantised rows) with the rows
    in a `ServingTier`: each batch's unique rows are read once, dequantised and pooled, the
    same arithmetic as its PyTorch path (equal outputs)."""

    def __init__(self, tier: ServingTier, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.tier = tier
        self.tables = list(tier.tables)
        self.feature_names = [t.feature_name for t in self.tables]
        self.dims = [t.embedding_dim for t in self.tables]
        self.precisions = list(tier.precisions)
        self.optimizer = SparseOptimizer()  # trains nothing (see QuantizedEmbeddingBagCollection)
        self.device = torch.device(device or "cpu")
        self.backend = f"ssd({tier.file.io})"

    # the KeyedJaggedTensor in, the KeyedTensor out: the in-memory collection's, over `pooled`
    forward = QuantizedEmbeddingBagCollection.forward

    def pooled(self, values: torch.Tensor, offsets: torch.Tensor, batch: int) -> torch.Tensor:
        """The pooled embeddings [batch, sum of dims] of `batch` bags per table, tables in
        feature order (`offsets`: tables * batch + 1 bag boundaries into `values`): `forward`
        without a KeyedJaggedTensor, as `QuantizedEmbeddingBagCollection.pooled`."""
        values, offsets = values.cpu().long(), offsets.cpu().long()
        per_table = offsets[batch::batch] - offsets[:-1:batch]
        table = torch.arange(len(self.tables)).repeat_interleave(per_table)
        sizes = torch.tensor(self.tier.sizes)
        bad = torch.nonzero((values < 0) | (values >= sizes[table]))
        if bad.numel():
            i = int(bad[0, 0])
            t = self.tables[int(table[i])]
            raise ValueError(
                f"row {int(values[i])} is outside table {t.name} ({t.num_embeddings} rows)"
            )
        gids = values + self.tier.row_base[table]
        unique, inverse = torch.unique(gids, return_inverse=True)  # sorted: table-major
        rows = self.tier.read_rows(unique)
        starts = torch.searchsorted(unique, self.tier.row_base)
        ends = torch.cat([starts[1:], torch.tensor([unique.numel()])])
        out = []
        for t, (p, dim, w) in enumerate(zip(self.precisions, self.dims, self.tier.widths)):
            lo, hi = int(starts[t]), int(ends[t])
            table_rows = dequantize_rows(rows[lo:hi, :w], p, dim)
            bags = offsets[t * batch : (t + 1) * batch + 1]
            a, b = int(bags[0]), int(bags[-1])
            out.append(F.embedding_bag(inverse[a:b] - lo, table_rows, bags[:-1] - a, mode="sum"))
        return torch.cat(out, dim=1).to(self.device)

    def table_weights(self) -> list[torch.Tensor]:
        """Every table dequantised to float32, read from the tier (whole tables: small ones)."""
        out = []
        for t, (n, p, dim, w) in enumerate(
            zip(self.tier.sizes, self.precisions, self.dims, self.tier.widths)
        ):
            gids = torch.arange(n) + self.tier.row_base[t]
            out.append(dequantize_rows(self.tier.read_uncached(gids)[:, :w], p, dim))
        return out

    def counters(self) -> dict:
        return {**no_transfer_counters(), **self.tier.counters()}

    def placement_info(self) -> dict:
        return {
            "kind": "quantized-ssd", "backend": self.backend, "precisions": self.precisions,
            "scm_dir": str(self.tier.dir), "scm_cache_rows": self.tier.cache.capacity,
            "scm_cache_bytes": self.tier.cache.capacity * self.tier.width,
        }  # fmt: skip

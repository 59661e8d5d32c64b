"""The SSD tier's undo journal: what makes a checkpoint a consistent point of the tier's files
without copying them.

Blocks are updated in place. Before a block that held rows at the last consistent point is
overwritten for the first time since then, its old contents (its *pre-image*) are appended to the
journal and made durable (one fsync per batch of blocks). So at any moment, even mid-write after a
kill -9, applying the journal's pre-images backwards turns the row file back into exactly its
state at that point. Blocks first written after that point need no pre-image: the tier's map of
written blocks, saved with each checkpoint, says their rows still had their initial values.

The journal file is: a header (magic, version, the tier's id, the *base* generation the file can
be rolled back to, CRC-32), then records, each `kind | id | CRC-32` plus a block for pre-images:
- PREIMAGE(block): the block before its first overwrite since the last base or PREPARE;
- PREPARE(generation): every row is flushed and fsynced: the file is at this generation (a
  checkpoint is being written). Pre-images start again after it, so the file can be rolled
  back to this generation too.
When the checkpoint is written, `commit` starts a new journal whose base is that generation
(written to a temporary and renamed: atomic). Rolling back to generation g applies, newest first,
the pre-images after g's position (the base, or its PREPARE). A torn last record (a kill during
an append, before the block it guards was touched) is ignored; damage anywhere else is an
ScmError.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from embeddings.errors import ScmError
from embeddings.ssd.file import BLOCK, io_error
from hybrid_dlrm.common.atomic import write_bytes
from hybrid_dlrm.common.crc import crc32

_HEADER = struct.Struct("<4sI16sQ")  # magic, version, tier id, base generation
_RECORD = struct.Struct("<4sIQ")  # magic, kind, block or generation
_MAGIC, _REC, VERSION = b"SCMJ", b"SCMR", 1
PREIMAGE, PREPARE = 1, 2


@dataclass
class JournalState:
    """A journal as read back: its base and, in order, its prepares and pre-images."""

    tier_id: bytes
    base: int
    prepares: list[tuple[int, int]] = field(default_factory=list)  # (generation, record index)
    preimages: list[tuple[int, int, int]] = field(default_factory=list)  # block, offset, index

    def generations(self) -> list[int]:
        return [self.base] + [g for g, _ in self.prepares]


class UndoJournal:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd = -1  # appended to with plain writes: no buffer left to flush after a failure

    # --- writing -----------------------------------------------------------------------------------

    def start(self, tier_id: bytes, base: int) -> None:
        """A new journal whose base is `base` (atomically replacing any old one)."""
        self.close()
        header = _HEADER.pack(_MAGIC, VERSION, tier_id, base)
        try:
            write_bytes(self.path, header + struct.pack("<I", crc32(header)))
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        except OSError as e:
            raise io_error(e, self.path, "the tier's journal") from None

    def _append(self, data: bytes) -> None:
        """`data` at the end, durable when this returns. A failed append (a full disk) is cut
        off again, so the journal ends at its last whole record, and is one line; the blocks
        it would have guarded are never written."""
        end = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
            os.fsync(self._fd)
        except OSError as e:
            try:
                os.ftruncate(self._fd, end)
            except OSError:
                pass  # what is left is a torn tail, which a rollback ignores
            self.close()  # nothing more is appended after a failure
            raise io_error(e, self.path, "the tier's journal") from None

    def _record(self, kind: int, ident: int, payload: bytes = b"") -> bytes:
        head = _RECORD.pack(_REC, kind, ident)
        return head + payload + struct.pack("<I", crc32(payload, crc32(head)))

    def add_preimages(self, blocks: np.ndarray, data: np.ndarray) -> None:
        """Pre-images of `blocks` ([n, BLOCK] uint8), durable when this returns."""
        if not len(blocks):
            return
        parts = [self._record(PREIMAGE, int(b), data[i].tobytes()) for i, b in enumerate(blocks)]
        self._append(b"".join(parts))

    def prepare(self, generation: int) -> None:
        self._append(self._record(PREPARE, generation))

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    # --- reading and rolling back ---------------------------------------------------------------

    def read(self) -> JournalState:
        """The journal's header and records (a torn last record dropped)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            raise ScmError(f"{self.path}: the tier's journal is missing") from None
        n = _HEADER.size + 4
        if len(raw) < n:
            raise ScmError(f"{self.path}: truncated journal header ({len(raw)} of {n} bytes)")
        magic, version, tier_id, base = _HEADER.unpack_from(raw)
        (crc,) = struct.unpack_from("<I", raw, _HEADER.size)
        if magic != _MAGIC or crc != crc32(raw[: _HEADER.size]):
            raise ScmError(f"{self.path}: not a tier journal, or its header is damaged")
        if version != VERSION:
            raise ScmError(f"{self.path}: journal version {version}, expected {VERSION}")
        state = JournalState(tier_id, base)
        pos, index = n, 0
        while pos < len(raw):
            ok, size, kind, ident = self._parse(raw, pos)
            if not ok:
                rest = len(raw) - pos
                if rest > _RECORD.size + BLOCK + 4:  # not a torn tail: damage
                    raise ScmError(
                        f"{self.path}: journal record at offset {pos} is damaged "
                        f"({rest} bytes follow it)"
                    )
                break  # a record cut by a kill: its block was not written yet
            if kind == PREPARE:
                state.prepares.append((ident, index))
            else:
                state.preimages.append((ident, pos + _RECORD.size, index))
            pos += size
            index += 1
        return state

    def _parse(self, raw: bytes, pos: int) -> tuple[bool, int, int, int]:
        if pos + _RECORD.size + 4 > len(raw):
            return False, 0, 0, 0
        magic, kind, ident = _RECORD.unpack_from(raw, pos)
        if magic != _REC or kind not in (PREIMAGE, PREPARE):
            return False, 0, 0, 0
        body = BLOCK if kind == PREIMAGE else 0
        end = pos + _RECORD.size + body
        if end + 4 > len(raw):
            return False, 0, 0, 0
        (crc,) = struct.unpack_from("<I", raw, end)
        if crc != crc32(raw[pos + _RECORD.size : end], crc32(raw[pos : pos + _RECORD.size])):
            return False, 0, 0, 0
        return True, end + 4 - pos, kind, ident

    def rollback_images(self, generation: int) -> tuple[np.ndarray, np.ndarray]:
        """(blocks, [n, BLOCK] images) that turn the row file back into `generation`, in the
        order to write them (newest first, so a block's oldest image is written last)."""
        state = self.read()
        if generation == state.base:
            first = -1
        else:
            at = [i for g, i in state.prepares if g == generation]
            if not at:
                raise ScmError(
                    f"{self.path}: the tier can be rolled back to generation "
                    f"{', '.join(map(str, state.generations()))}, not {generation}"
                )
            first = at[-1]
        raw = self.path.read_bytes()
        chosen = [(b, off) for b, off, i in state.preimages if i > first][::-1]
        blocks = np.array([b for b, _ in chosen], dtype=np.int64)
        images = np.frombuffer(b"".join(raw[o : o + BLOCK] for _, o in chosen), dtype=np.uint8)
        return blocks, images.reshape(-1, BLOCK)

    def tier_id(self) -> bytes:
        return self.read().tier_id

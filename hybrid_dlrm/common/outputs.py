"""The one output rule: whether a command may write a file or a directory at the path a user named.

Every output flag of every command (model files, reports, plans, profiles, artifacts, predictions,
datasets, run directories, benchmark JSON) is checked here before any long work, in this order;
each refusal is one line, `FLAG: PATH ...`, raised as `OutputRefused` (a ValueError) or the
caller's own error class:

1. A symbolic link as the path's last component is refused, whatever it points to: writing
   through it would write somewhere the command line does not name, and replacing it would
   replace the link. Links among the parent directories are followed.
2. A file is written only where a regular file is or none is: a device node, a FIFO, a socket
   or a directory is refused (`/dev/null` stays a device). A directory is made only where a
   directory is or none is. The nearest existing parent must be a writable directory.
3. The command's inputs and its own run files (`protected`: the raw data, the dataset, the
   resumed run, the model loaded, metrics.jsonl, config.json, summary.json, checkpoints/) are
   never written, with `--overwrite` neither: caught by resolved path (the path itself, or a path
   inside a protected directory) and by device and inode (a hard link to one).
4. An existing file is replaced only when this product wrote it for the same purpose (a plan
   over a plan: `Purpose.identify` reads its header, never more than it needs), or with
   `--overwrite`. A purpose without an identity (a predictions CSV) needs `--overwrite`. An
   existing directory is used only when it is empty or one this product made for the same purpose
   (a dataset, a run: its writer then reuses or continues it); `--overwrite` never deletes one.
   A file a command reads when it exists and writes only when it does not (`--profile-file`,
   `--placement-plan`: `Purpose.reused`) is left to its reader's checks.
5. A file pair (a placement plan's `X.npz` and `X.json`) is named by one stem: `X`, `X.npz` or
   `X.json`; any other suffix (`plan.txt`) is refused, and each member that would be written is
   checked by the rules above.

The identities below read only the standard library, so every layer may use them; each format's
name stays in its home module (a purpose is made there: `Purpose("placement plan",
identify=npz_format_is(FORMAT))`).
"""

from __future__ import annotations

import ast
import json
import os
import stat
import struct
import zipfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["OutputRefused", "Purpose", "check_output", "check_pair", "json_format_is", "npz_format_is",
           "pair_stem", "png_marker", "png_made_for", "torch_format_is"]  # fmt: skip

_KINDS = {stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory",
          stat.S_IFREG: "a regular file", stat.S_IFLNK: "a symbolic link"}  # fmt: skip
_HEADER_BYTES = 64 << 20  # an identity never reads more than this (a JSON header, a zip's member)


class OutputRefused(ValueError):
    """A path an output flag may not write: the message is the one line the command prints."""


@dataclass(frozen=True)
class Purpose:
    """What a command writes at a path: its name in messages ("model file"), whether it is a
    directory, how to recognise one this product wrote (None: nothing is recognised, so an
    existing file needs --overwrite), and whether an existing one is read instead of written."""

    name: str
    directory: bool = False
    identify: Callable[[Path], bool] | None = None
    reused: bool = False


def _kind(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def _identifies(purpose: Purpose, path: Path) -> bool:
    if purpose.identify is None:
        return False
    try:
        return bool(purpose.identify(path))
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, struct.error):
        return False  # unreadable or malformed: not recognisably ours


def _protected_hit(target: Path, st: os.stat_result | None, label: str, p: Path) -> str | None:
    """How `target` collides with the protected `p`, or None."""
    try:
        rp = p.resolve()
        pst = rp.stat()
    except OSError:
        return None  # not there: nothing to protect
    if target == rp:
        return "is"
    if rp in target.parents:
        return "is inside"
    if st is None or not stat.S_ISREG(st.st_mode):
        return None
    if stat.S_ISDIR(pst.st_mode):
        files = (f for f in rp.rglob("*") if f.is_file() and not f.is_symlink())
        inodes = ((f.stat().st_dev, f.stat().st_ino) for f in files)
    else:
        inodes = iter([(pst.st_dev, pst.st_ino)])
    if (st.st_dev, st.st_ino) in inodes:
        return "is a hard link to"
    return None


def check_output(
    path: str | Path,
    flag: str,
    purpose: Purpose,
    *,
    protected: Mapping[str, str | Path | None] | Iterable[tuple[str, str | Path | None]] = (),
    overwrite: bool = False,
    error: type[Exception] = OutputRefused,
) -> Path:
    """`path` when `flag` may write `purpose` there (the module's rules), else `error` with the
    one line. `protected` maps a label ("--raw-data-file", "the run's metrics.jsonl") to a path
    never written (None entries are skipped)."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # a parent that is a file: named below
        st = None
    except OSError as e:
        raise error(f"{flag}: {path} cannot be examined ({e.strerror or e})") from None
    want = f"expected the name of a {purpose.name}"
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise error(
            f"{flag}: {path} is a symbolic link, which is never written through or replaced; "
            "name the file itself"
        )
    if st is not None and not (stat.S_ISDIR if purpose.directory else stat.S_ISREG)(st.st_mode):
        raise error(f"{flag}: {path} is {_kind(st.st_mode)}; {want}")
    base = path.absolute().parent
    while not base.exists():
        base = base.parent
    if not base.is_dir():
        raise error(f"{flag}: {path} cannot be created: {base} is a file")
    for where in (base, path) if st is not None and purpose.directory else (base,):
        if not os.access(where, os.W_OK | os.X_OK):  # a read-only file system fails this too
            raise error(f"{flag}: {path} cannot be written: {where} is not writable")
    target = path.parent.resolve() / path.name
    items = protected.items() if isinstance(protected, Mapping) else protected
    for label, p in items:
        if p is None or str(p) == "":
            continue
        how = _protected_hit(target, st, label, Path(p))
        if how is not None:
            raise error(
                f"{flag}: {path} {how} {label} {p}, which is never written over; "
                "choose another name"
            )
    if st is None or purpose.reused:
        return path
    ours = "" if purpose.identify is None else f" and is not a {purpose.name} this product made"
    if purpose.directory:
        if _identifies(purpose, path) or not any(path.iterdir()):
            return path
        raise error(
            f"{flag}: {path} already exists (a directory, not empty){ours}; choose another "
            "name or remove it (--overwrite never deletes a directory)"
        )
    if _identifies(purpose, path) or overwrite:
        return path
    raise error(
        f"{flag}: {path} already exists{ours}; pass --overwrite to replace it, or choose "
        "another name"
    )


def pair_stem(
    path: str | Path, flag: str, suffixes: tuple[str, ...], what: str,
    error: type[Exception] = OutputRefused,
) -> Path:  # fmt: skip
    """The stem X a file pair (X.npz and X.json) is named by: `path` is X or X with one of
    `suffixes`; any other suffix is `error` (it would otherwise name a third file the pair
    never is, and write beside it)."""
    path = Path(path)
    if path.suffix in suffixes:
        return path.with_suffix("")
    if path.suffix == "":
        return path
    names = " and ".join(f"X{s}" for s in suffixes)
    raise error(
        f"{flag}: {path} is not a {what} name: a {what} is the pair {names}; name "
        f"{path.with_suffix(suffixes[0])} (or {path.with_suffix('')})"
    )


def check_pair(
    path: str | Path,
    flag: str,
    members: Mapping[str, Purpose],
    *,
    protected: Mapping[str, str | Path | None] = {},
    overwrite: bool = False,
    error: type[Exception] = OutputRefused,
) -> Path:
    """The first member's path (X.npz) of the pair `path` names, each member checked by
    `check_output`. A reused pair whose first member exists is read as it is: the rest of the
    pair is not written then."""
    suffixes = tuple(members)
    first = next(iter(members.values()))
    if Path(path).is_dir():  # X itself is not written, but a directory there means a mistake
        raise error(f"{flag}: {path} is a directory; expected the name of a {first.name}")
    stem = pair_stem(path, flag, suffixes, first.name, error)
    main = Path(f"{stem}{suffixes[0]}")
    for suffix, purpose in members.items():
        member = Path(f"{stem}{suffix}")
        check_output(member, flag, purpose, protected=protected, overwrite=overwrite, error=error)
        if purpose.reused and member == main and member.is_file():
            break
    return main


# --- identities: is an existing file one this product wrote for a purpose? -------------------


def _read_head(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(_HEADER_BYTES)


def json_format_is(format: str) -> Callable[[Path], bool]:
    """A JSON object whose "format" is `format` (a plan's .json, a performance model)."""

    def identify(path: Path) -> bool:
        doc = json.loads(_read_head(path))
        return isinstance(doc, dict) and doc.get("format") == format

    return identify


def _npy_text(raw: bytes) -> str:
    """The string of a 0-d unicode `.npy` array (numpy's format, read by hand: no numpy here)."""
    if raw[:6] != b"\x93NUMPY":
        raise ValueError("not an .npy array")
    major = raw[6]
    size_at, fmt = (8, "<H") if major == 1 else (8, "<I")
    (length,) = struct.unpack_from(fmt, raw, size_at)
    start = size_at + struct.calcsize(fmt)
    header = ast.literal_eval(raw[start : start + length].decode("latin-1"))
    if not str(header["descr"]).startswith("<U") or header["shape"] != ():
        raise ValueError("not a 0-d unicode array")
    return raw[start + length :].decode("utf-32-le").rstrip("\x00")


def npz_format_is(format: str) -> Callable[[Path], bool]:
    """An `.npz` whose `meta` member is this product's JSON header naming `format` (plans,
    access profiles)."""

    def identify(path: Path) -> bool:
        with zipfile.ZipFile(path) as z:
            info = z.getinfo("meta.npy")
            if info.file_size > _HEADER_BYTES:
                return False
            doc = json.loads(_npy_text(z.read(info)))
        return isinstance(doc, dict) and doc.get("format") == format

    return identify


def torch_format_is(format: str) -> Callable[[Path], bool]:
    """A `torch.save` zip whose pickled record names `format` (checkpoints, model files). The
    record's bytes are searched, never unpickled."""
    needle = format.encode()

    def identify(path: Path) -> bool:
        with zipfile.ZipFile(path) as z:
            infos = [i for i in z.infolist() if i.filename.endswith("/data.pkl")]
            if len(infos) != 1 or infos[0].file_size > _HEADER_BYTES:
                return False
            return needle in z.read(infos[0])

    return identify


PNG_KEY = "hybrid-dlrm"  # the tEXt chunk a PNG this product draws carries: its purpose


def png_marker(purpose: Purpose) -> dict[str, str]:
    """matplotlib's `savefig(metadata=...)` for a PNG of `purpose`: what `png_made_for` reads."""
    return {PNG_KEY: purpose.name}


def png_made_for(name: str) -> Callable[[Path], bool]:
    """A PNG with a tEXt chunk `hybrid-dlrm` = `name` (written through `png_marker`)."""

    def identify(path: Path) -> bool:
        raw = _read_head(path)
        if raw[:8] != b"\x89PNG\r\n\x1a\n":
            return False
        at = 8
        while at + 8 <= len(raw):
            length, kind = struct.unpack_from(">I4s", raw, at)
            if kind == b"tEXt":
                key, _, text = raw[at + 8 : at + 8 + length].partition(b"\x00")
                if key == PNG_KEY.encode() and text == name.encode("latin-1"):
                    return True
            if kind == b"IEND":
                break
            at += 12 + length
        return False

    return identify

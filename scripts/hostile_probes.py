"""Issue #25's review: each mistake and each damaged file, tried on the command lines as a hostile
but fair user would, on tiny synthetic data. Prints a JSON list (or --markdown, a table).

    python scripts/hostile_probes.py [--only SUBSTRING] [--section SUBSTRING] [--markdown] [--keep DIR]

Every probe runs one command in a fresh copy of a small world (a finished tiny run with three
checkpoints and a model file, a preprocessed Kaggle-shaped directory, Terabyte day files, a
profile and a plan) and checks what the issue asks: a mistake ends with exit code 2 and exactly
one line on stderr naming the flag, file or line (no traceback, no advice to unpickle); a case the
run should survive ends with exit 0 and says what it did in one warning; and the files a probe
names as the user's are byte for byte as they were. `ok` is false where any of that fails, and
`outcome` says how: data loss, silent corruption, hang, traceback, misleading, or ok. Issue #46's
probes (hostile_probes_endings.py) add Ctrl-C and SIGTERM at a point reached (exit 130 / 143, one
line per process), sizes past the machine, locks and read-only places that must not be waited on.
Takes a few minutes (each command starts Python and torch).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import hostile_probes_endings as endings  # scripts/, beside this file
import hostile_probes_serving as serving

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--arch-embedding-size", "60-40-500-7", "--arch-sparse-feature-size", "4",
        "--arch-mlp-bot", "13-16-4", "--arch-mlp-top", "16-1", "--mini-batch-size", "64",
        "--data-size", "1920", "--test-data-size", "2048", "--progress", "false"]  # fmt: skip
CRITEO = ["--arch-sparse-feature-size", "4", "--arch-mlp-bot", "13-8-4", "--arch-mlp-top",
          "8-1", "--mini-batch-size", "32", "--progress", "false"]  # fmt: skip
FAE = ["--placement", "fae", "--hot-budget", "1KB", "--profile-sample-rate", "0.2"]


@dataclass
class Probe:
    name: str
    section: str  # the heading
    make: Callable[[Path], list[str]]  # builds the case in a fresh world; returns the command
    expect: str = "error"  # error: exit 2, one line; survive: exit 0, `says` in a warning;
    # interrupted / terminated: exit 130 / 143, `lines` lines (issue 46)
    says: str = ""  # a piece of the line the user must see
    keep: tuple[str, ...] = ()  # paths (relative to the world) that must not change
    result: dict = field(default_factory=dict)
    signal: endings.Signal | None = None  # Ctrl-C / SIGTERM to its process group, and when
    timeout: float = 600  # seconds before it counts as a hang
    lines: int = 1  # lines of our own on stderr (interrupted: one per process that says one)


def train(*args: str) -> list[str]:
    return [sys.executable, "-m", "dlrm.train", *args]


def pipeline(*args: str) -> list[str]:
    return [sys.executable, "-m", "data_pipeline", *args]


def profile(*args: str) -> list[str]:
    return [sys.executable, "-m", "embeddings.profile", *args]


def edit(path: Path, fn: Callable[[bytearray], bytes | bytearray]) -> None:
    path.write_bytes(bytes(fn(bytearray(path.read_bytes()))))


def flip(offset: float, count: int = 1) -> Callable[[bytearray], bytearray]:
    def do(raw: bytearray) -> bytearray:
        start = int(offset * (len(raw) - count))
        for i in range(start, start + count):
            raw[i] ^= 0x5A
        return raw

    return do


def zero_4k(offset: float) -> Callable[[bytearray], bytearray]:
    def do(raw: bytearray) -> bytearray:
        start = int(offset * max(0, len(raw) - 4096))
        raw[start : start + 4096] = bytes(len(raw[start : start + 4096]))
        return raw

    return do


def newest(w: Path) -> Path:
    return w / "A/checkpoints/step_000000030.pt"


def tensor_offset(path: Path) -> int:
    """Where the first large tensor record starts in a checkpoint (past the pickled outline)."""
    import zipfile

    with zipfile.ZipFile(path) as z:
        info = max(z.infolist(), key=lambda i: i.file_size)
        return info.header_offset + 30 + len(info.filename) + len(info.extra) + 64


# --- the world -------------------------------------------------------------------------------


def build_world(base: Path) -> None:
    """A finished tiny run A (checkpoints 10, 20, 30; model file), a profile and plan, Kaggle and
    Terabyte raw files, and the preprocessed Kaggle directory."""

    def run(argv: list[str]) -> None:
        done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
        if done.returncode != 0:
            raise SystemExit(f"building the world failed: {argv}\n{done.stderr}")

    run(train(*TINY, "--test-freq", "10", "--keep-checkpoints", "3", "--out-dir", str(base / "A"),
              "--save-model", str(base / "A.model.pt")))  # fmt: skip
    run(train(*TINY, *FAE, "--num-batches", "2", "--test-data-size", "64", "--out-dir",
              str(base / "F"), "--profile-file", str(base / "profile.npz"),
              "--placement-plan", str(base / "plan.npz")))  # fmt: skip
    run(pipeline("synth", "--layout", "kaggle", "--out", str(base / "kraw"), "--lines", "700",
                 "--vocab-cap", "300"))  # fmt: skip
    run(pipeline("preprocess", "--dataset", "kaggle", "--raw", str(base / "kraw/train.txt"),
                 "--out", str(base / "kdata"), "--max-ind-range", "1000", "--no-progress"))  # fmt: skip
    run(pipeline("synth", "--layout", "terabyte", "--out", str(base / "traw"), "--lines", "30",
                 "--vocab-cap", "50"))  # fmt: skip


def kaggle(w: Path, *extra: str) -> list[str]:
    return train(*CRITEO, "--data-set", "kaggle", "--processed-data-file", str(w / "kdata"),
                 "--out-dir", str(w / "K"), *extra)  # fmt: skip


def sparse_day(w: Path, day: int = 2) -> Path:
    return w / f"kdata/day_{day}.sparse.npy"


def set_id(w: Path, value: int, fix_crc: bool) -> None:
    """Write `value` into day 2's sparse column, row 3, feature 5; with `fix_crc` also its marker's
    CRC-32 and the part's (a file edited on purpose, consistently: only the id check can tell)."""
    import numpy as np

    from data_pipeline.npy_stream import data_crc32

    path = sparse_day(w)
    a = np.load(path, mmap_mode="r+")
    a[3, 5] = value
    a.flush()
    del a
    if fix_crc:
        marker = w / "kdata/day_2.done.json"
        record = json.loads(marker.read_text())
        record["files"]["sparse"]["crc32"] = data_crc32(path)
        marker.write_text(json.dumps(record))


def stop_after_checkpoint(w: Path) -> None:
    """Run A as if killed right after its step-20 checkpoint: the step-30 one is gone and
    metrics.jsonl goes on past step 20."""
    newest(w).unlink()
    (w / "A/summary.json").unlink()


# --- the probes ------------------------------------------------------------------------------

C, W_, R, M = (
    "Corruption is detected",
    "Nothing overwritten or dropped",
    "Resume means the same run",
    "Every mistake is one line",
)


def probes() -> list[Probe]:
    p: list[Probe] = []

    def add(name, section, make, expect="error", says="", keep=(), signal=None, timeout=600,
            after=None, lines=1):  # fmt: skip
        p.append(Probe(name, section, make, expect, says, tuple(keep), signal=signal,
                       timeout=timeout, lines=lines))  # fmt: skip
        if after is not None:
            AFTER[name] = after

    ckpts = ("A/checkpoints/step_000000010.pt", "A/checkpoints/step_000000020.pt")
    # checkpoints and model files
    for label, damage in [
        ("1 flipped bit in the outline", lambda w: edit(newest(w), flip(0.02))),
        ("1 flipped bit in a tensor", lambda w: edit(newest(w), flip(tensor_offset(newest(w)) / newest(w).stat().st_size))),
        ("64 flipped bytes in the optimizer state", lambda w: edit(newest(w), flip(0.8, 64))),
        ("4 KiB of zeros mid-file", lambda w: edit(newest(w), zero_4k(0.5))),
        ("truncated to half", lambda w: edit(newest(w), lambda r: r[: len(r) // 2])),
        ("emptied (0 bytes)", lambda w: newest(w).write_bytes(b"")),
        ("replaced by random bytes", lambda w: newest(w).write_bytes(os.urandom(30000))),
    ]:  # fmt: skip
        add(f"--resume FILE: newest checkpoint {label}", C,
            lambda w, d=damage: (d(w), train(*TINY, "--out-dir", str(w / "B"), "--resume", str(newest(w))))[1],
            says="step_000000030.pt: ", keep=ckpts)  # fmt: skip
        add(f"--resume of the run directory: newest checkpoint {label}", C,
            lambda w, d=damage: (d(w), train(*TINY, "--keep-checkpoints", "3", "--out-dir", str(w / "A"), "--resume"))[1],
            expect="survive", says="skipped 1 corrupt checkpoint", keep=ckpts)  # fmt: skip
    add("--resume: every checkpoint of the run damaged", C,
        lambda w: ([edit(q, flip(0.5, 8)) for q in (w / "A/checkpoints").glob("*.pt")],
                   train(*TINY, "--out-dir", str(w / "A"), "--resume"))[1],
        says="no checkpoint in")  # fmt: skip
    add("--resume FILE: a pickle that would run code", C,
        lambda w: (_evil_pickle(w / "evil.pt"), train(*TINY, "--out-dir", str(w / "B"), "--resume", str(w / "evil.pt")))[1],
        says="evil.pt: not a readable checkpoint")  # fmt: skip
    add("--load-model: model file with a flipped bit", C,
        lambda w: (edit(w / "A.model.pt", flip(0.7)), train(*TINY, "--out-dir", str(w / "B"), "--load-model", str(w / "A.model.pt")))[1],
        says="A.model.pt: corrupt")  # fmt: skip
    add("--inference-only --load-model: model file truncated", C,
        lambda w: (edit(w / "A.model.pt", lambda r: r[:-100]), train(*TINY, "--out-dir", str(w / "B"), "--inference-only", "--load-model", str(w / "A.model.pt")))[1],
        says="A.model.pt: ")  # fmt: skip
    add("--load-model: a model of another architecture", C,
        lambda w: train(*other_arch(TINY, "--arch-embedding-size", "60-40-500-8"), "--out-dir", str(w / "B"), "--load-model", str(w / "A.model.pt")),
        says="does not fit the model")  # fmt: skip
    add("--resume FILE: a --save-model file", C,
        lambda w: train(*TINY, "--out-dir", str(w / "B"), "--resume", str(w / "A.model.pt")),
        says="a model file (weights only")  # fmt: skip
    # datasets
    for col, where in [
        ("sparse", 0.0),
        ("sparse", 0.5),
        ("sparse", 1.0),
        ("dense", 0.5),
        ("labels", 1.0),
    ]:
        add(f"16 flipped bytes in day_2.{col}.npy at {where:.0%}", C,
            lambda w, c=col, x=where: (edit(w / f"kdata/day_2.{c}.npy", flip(x, 16)), kaggle(w, "--num-batches", "4"))[1],
            says=f"day_2.{col}.npy: " + ("cannot be read (its header is damaged" if where == 0.0 else "checksum differs"))  # fmt: skip
    add("an id beyond its table, CRC-32s made consistent", C,
        lambda w: (set_id(w, 1_400_000_000, True), kaggle(w, "--num-batches", "4"))[1],
        says="row 3: id 1400000000 of cat_5 is outside its table")  # fmt: skip
    add("a negative id, CRC-32s made consistent", C,
        lambda w: (set_id(w, -7, True), kaggle(w, "--num-batches", "4"))[1],
        says="row 3: id -7 of cat_5 is outside its table")  # fmt: skip
    add("day_2.dense.npy truncated", C,
        lambda w: (edit(w / "kdata/day_2.dense.npy", lambda r: r[:-52]), kaggle(w))[1],
        says="day_2.dense.npy")  # fmt: skip
    add("day_2.sparse.npy deleted", C,
        lambda w: ((w / "kdata/day_2.sparse.npy").unlink(), kaggle(w))[1], says="day_2.sparse.npy")  # fmt: skip
    add("meta.json garbage", C,
        lambda w: ((w / "kdata/meta.json").write_text("{ not json"), kaggle(w))[1], says="meta.json")  # fmt: skip
    add("a part's marker (done.json) garbage", C,
        lambda w: ((w / "kdata/day_2.done.json").write_text("]"), kaggle(w))[1], says="day_2.done.json")  # fmt: skip
    add("data_pipeline info on a damaged meta.json", C,
        lambda w: ((w / "kdata/meta.json").write_text("[]"), pipeline("info", str(w / "kdata")))[1], says="meta.json")  # fmt: skip
    # plans and profiles
    for flag, name in [("--profile-file", "profile.npz"), ("--placement-plan", "plan.npz")]:
        for label, damage in [("empty", lambda r: b""), ("truncated", lambda r: r[: len(r) // 2]),
                              ("1 flipped bit in the data", flip(0.5)), ("garbage", lambda r: os.urandom(300))]:  # fmt: skip
            add(f"{flag} {label}", C,
                lambda w, f=flag, n=name, d=damage: (edit(w / n, d), train(*TINY, *FAE, "--num-batches", "2", "--out-dir", str(w / "B"), "--profile-file", str(w / "profile.npz"), "--placement-plan", str(w / ("plan.npz" if f == "--placement-plan" else "new-plan.npz"))))[1],
                says=name)  # fmt: skip
    add("--placement-plan: its JSON half garbage", C,
        lambda w: ((w / "plan.json").write_text("{"), train(*TINY, *FAE, "--num-batches", "2", "--out-dir", str(w / "B"), "--profile-file", str(w / "profile.npz"), "--placement-plan", str(w / "plan.npz")))[1],
        expect="survive")  # the JSON is for people: the plan is read from the .npz  # fmt: skip
    add("embeddings.profile on a truncated profile", C,
        lambda w: (edit(w / "profile.npz", lambda r: r[:100]), profile(str(w / "profile.npz")))[1],
        says="profile.npz")  # fmt: skip
    add("embeddings.profile --out into a directory that is a file", C,
        lambda w: profile(str(sparse_day(w)), "--out", str(w / "A.model.pt/p.npz")),
        says="A.model.pt", keep=["A.model.pt"])  # fmt: skip
    add("embeddings.profile on a missing .npy", C,
        lambda w: profile(str(w / "nothing.npy")), says="nothing.npy")  # fmt: skip
    # nothing overwritten or dropped
    add("--resume A --out-dir B where B holds another run", W_,
        lambda w: (shutil.copytree(w / "F", w / "B"), train(*TINY, "--out-dir", str(w / "B"), "--resume", str(w / "A")))[1],
        says="already holds another run", keep=["B/summary.json", "B/metrics.jsonl", "B/config.json"])  # fmt: skip
    add("a new run in a directory holding a run", W_,
        lambda w: train(*TINY, "--out-dir", str(w / "A")),
        says="already holds a run", keep=["A/summary.json", "A/metrics.jsonl", *ckpts])  # fmt: skip
    for label, damage in [("0-byte day_23", lambda w: (w / "traw/day_23").write_bytes(b"")),
                          ("0-byte day_5.gz", lambda w: ((w / "traw/day_5").unlink(), gzip.open(w / "traw/day_5.gz", "wb").close())),
                          ("missing day_7", lambda w: (w / "traw/day_7").unlink()),
                          ("day_3.gz that is not gzip", lambda w: (w / "traw/day_3").rename(w / "traw/day_3.gz"))]:  # fmt: skip
        add(f"Terabyte: {label}", W_,
            lambda w, d=damage: (d(w), train(*CRITEO, "--data-set", "terabyte", "--raw-data-file", str(w / "traw/day"), "--out-dir", str(w / "T")))[1],
            says="day_")  # fmt: skip
    add("raw train.txt replaced by other content of the same size", W_,
        lambda w: (edit(w / "kraw/train.txt", lambda r: r.replace(b"\t1\t", b"\t2\t", 5)),
                   pipeline("preprocess", "--dataset", "kaggle", "--raw", str(w / "kraw/train.txt"), "--out", str(w / "kdata"), "--max-ind-range", "1000", "--no-progress"))[1],
        says="made from other raw files", keep=["kdata/meta.json"])  # fmt: skip
    add(
        "metrics.jsonl after a resume reads as one run",
        W_,
        lambda w: (stop_after_checkpoint(w), train(*TINY, "--out-dir", str(w / "A"), "--resume"))[
            1
        ],
        expect="survive",
        says="",
    )  # checked in `check_one_run`
    # resume means the same run
    add("--resume with another --seed", R,
        lambda w: train(*TINY, "--seed", "7", "--out-dir", str(w / "A"), "--resume", "--nepochs", "2"),
        says="--seed 123 -> 7", keep=["A/config.json", "A/metrics.jsonl"])  # fmt: skip
    add("--resume with another --learning-rate and --test-data-size", R,
        lambda w: train(*TINY[:-4], "--test-data-size", "1024", "--progress", "false", "--learning-rate", "0.5", "--out-dir", str(w / "A"), "--resume", "--nepochs", "2"),
        says="--allow-changed learning-rate,test-data-size", keep=["A/config.json"])  # fmt: skip
    add("--resume --allow-changed lr with another --learning-rate", R,
        lambda w: train(*TINY, "--learning-rate", "0.5", "--allow-changed", "lr", "--out-dir", str(w / "A"), "--resume", "--nepochs", "2"),
        expect="survive")  # fmt: skip
    add("--allow-changed naming no setting", R,
        lambda w: train(*TINY, "--allow-changed", "lr,colour", "--out-dir", str(w / "A"), "--resume"),
        says="--allow-changed: no setting named 'colour'")  # fmt: skip
    add("--resume with another architecture", R,
        lambda w: train(*other_arch(TINY, "--arch-mlp-bot", "13-32-4"), "--out-dir", str(w / "A"), "--resume"),
        says="written for a different model")  # fmt: skip
    add("--resume of a run killed in its first checkpoint", R,
        lambda w: ([q.rename(q.with_name(f".{q.name}.tmp-999999999")) for q in (w / "A/checkpoints").glob("*.pt")],
                   (w / "A/summary.json").unlink(), train(*TINY, "--out-dir", str(w / "A"), "--resume"))[2],
        expect="survive", says="yet: starting from the beginning")  # fmt: skip
    add("--resume of a path that does not exist", R,
        lambda w: train(*TINY, "--out-dir", str(w / "B"), "--resume", str(w / "nowhere")), says="nowhere")  # fmt: skip
    # every mistake is one line
    for label, args, says in [
        ("--out-dir that is a file", ["--out-dir", "A.model.pt"], "A.model.pt is a regular file; expected the name of a run directory"),
        ("--out-dir under a file", ["--out-dir", "A.model.pt/run"], "--out-dir"),
        ("--save-model that is a directory", ["--save-model", "A"], "--save-model"),
        ("--save-model under a file", ["--save-model", "A.model.pt/m.pt"], "--save-model"),
        ("--seed -1", ["--seed", "-1"], "--seed"), ("--seed 2**64", ["--seed", str(2**64)], "--seed"),
        ("--synthetic-zipf -1", ["--synthetic-zipf", "-1"], "--synthetic-zipf"),
        ("--synthetic-zipf nan", ["--synthetic-zipf", "nan"], "--synthetic-zipf"),
        ("--learning-rate nan", ["--learning-rate", "nan"], "--learning-rate"),
        ("--learning-rate inf", ["--learning-rate", "inf"], "--learning-rate"),
        ("--learning-rate -0.1", ["--learning-rate", "-0.1"], "--learning-rate"),
        ("--inference-only without weights", ["--inference-only"], "--inference-only"),
        ("--mini-batch-size 0", ["--mini-batch-size", "0"], "--mini-batch-size"),
        ("--num-batches -1", ["--num-batches", "-1"], "--num-batches"),
        ("--hot-budget lots", ["--placement", "fae", "--hot-budget", "lots"], "--hot-budget"),
        ("--data-sub-sample-rate 1", ["--data-sub-sample-rate", "1"], "--data-sub-sample-rate"),
        ("--keep-checkpoints 0", ["--keep-checkpoints", "0"], "--keep-checkpoints"),
        ("--profile-sample-rate 0", ["--profile-sample-rate", "0"], "--profile-sample-rate"),
        ("--perf-log that is a file", ["--perf-log", "A.model.pt"], "--perf-log"),
        ("--perf-log under a file", ["--perf-log", "A.model.pt/run"], "--perf-log"),
        ("--profile-file that is a directory", ["--placement", "fae", "--profile-file", "A"], "--profile-file"),
        ("--placement-plan under a file", ["--placement", "fae", "--placement-plan", "A.model.pt/m.pt"], "--placement-plan"),
        ("--data-set kaggle without data", ["--data-set", "kaggle"], "--data-set kaggle"),
        ("--processed-data-file that does not exist", ["--data-set", "kaggle", "--processed-data-file", "nowhere"], "nowhere is not a preprocessed data set"),
        ("--raw-data-file that does not exist", ["--data-set", "kaggle", "--raw-data-file", "nowhere.txt"], "nowhere.txt: not found"),
        ("--raw-data-file that is empty", ["--data-set", "kaggle", "--raw-data-file", "empty.txt"], "empty.txt: 0 lines"),
        ("--mini-batch-size abc", ["--mini-batch-size", "abc"], "--mini-batch-size"),
        ("an unknown flag", ["--colour", "blue"], "--colour"),
    ]:  # fmt: skip
        add(label, M, lambda w, a=args: ((w / "empty.txt").write_bytes(b""), train(*TINY, "--out-dir", str(w / "B"), *[str(w / x) if x in WORLD_PATHS else x for x in a]))[1],
            says=says, keep=["A.model.pt", "A/summary.json"])  # fmt: skip
    add("--max-ind-range -5 (the reference's 'no hashing')", M,
        lambda w: train(*TINY, "--out-dir", str(w / "B"), "--max-ind-range", "-5"), expect="survive")  # fmt: skip
    add("--on-bad-line skip, every line bad: gzip data named .txt", M,
        lambda w: (edit(w / "kraw/train.txt", lambda r: gzip.compress(bytes(r))), pipeline("preprocess", "--dataset", "kaggle", "--raw", str(w / "kraw/train.txt"), "--out", str(w / "k2"), "--on-bad-line", "skip", "--no-progress"))[1],
        says="train.txt")  # fmt: skip
    for label, args, says in [
        ("preprocess: --raw that does not exist", ["preprocess", "--dataset", "kaggle", "--raw", "nowhere", "--out", "k2"], "nowhere: not found"),
        ("preprocess: --out that is a file", ["preprocess", "--dataset", "kaggle", "--raw", "kraw/train.txt", "--out", "A.model.pt"], "A.model.pt is a regular file"),
        ("preprocess: --out under a file", ["preprocess", "--dataset", "kaggle", "--raw", "kraw/train.txt", "--out", "A.model.pt/run"], "A.model.pt is a file"),
        ("preprocess: an unknown --dataset", ["preprocess", "--dataset", "criteo", "--raw", "kraw/train.txt", "--out", "k2"], "--dataset"),
        ("preprocess: a missing --out", ["preprocess", "--dataset", "kaggle", "--raw", "kraw/train.txt"], "--out"),
        ("preprocess: --workers -1", ["preprocess", "--dataset", "kaggle", "--raw", "kraw/train.txt", "--out", "k2", "--workers", "-1"], "--workers"),
        ("preprocess: --data-sub-sample-rate 2", ["preprocess", "--dataset", "kaggle", "--raw", "kraw/train.txt", "--out", "k2", "--data-sub-sample-rate", "2"], "--data-sub-sample-rate"),
        ("preprocess: other settings into an existing directory", ["preprocess", "--dataset", "kaggle", "--raw", "kraw/train.txt", "--out", "kdata", "--max-ind-range", "77"], "max_ind_range: 1000 there, 77 asked"),
        ("info: a directory that is no dataset", ["info", "A"], "A/meta.json: not found"),
        ("synth: --lines abc", ["synth", "--layout", "kaggle", "--out", "k2", "--lines", "abc"], "--lines"),
    ]:  # fmt: skip
        add(label, M, lambda w, a=args: pipeline(*[str(w / x) if x in WORLD_PATHS else x for x in a]),
            says=says, keep=["A.model.pt", "kdata/meta.json"])  # fmt: skip
    # the output rule (docs/integrity.md): nothing written over an input, a run file or a device
    add("--save-model onto the run's own raw input", M,
        lambda w: train(*TINY, "--out-dir", str(w / "B"), "--data-set", "kaggle", "--raw-data-file", str(w / "kraw/train.txt"), "--save-model", str(w / "kraw/train.txt")),
        says="is --raw-data-file", keep=["kraw/train.txt"])  # fmt: skip
    add("--save-model onto the run's own metrics.jsonl", M,
        lambda w: train(*TINY, "--out-dir", str(w / "A"), "--resume", "--save-model", str(w / "A/metrics.jsonl")),
        says="never written over", keep=["A/metrics.jsonl"])  # fmt: skip
    add("--placement-plan foo.txt beside an unrelated foo.json", M,
        lambda w: ((w / "foo.json").write_text('{"mine": 1}'), train(*TINY, "--out-dir", str(w / "B"), "--placement", "fae", "--placement-plan", str(w / "foo.txt")))[1],
        says="is not a placement plan name", keep=["foo.json"])  # fmt: skip
    add("dlrm.report --out onto the run's metrics.jsonl", M,
        lambda w: [sys.executable, "-m", "dlrm.report", str(w / "A"), "--out", str(w / "A/metrics.jsonl")],
        says="never written over", keep=["A/metrics.jsonl"])  # fmt: skip
    add("embeddings.profile --plot that is a directory", M,
        lambda w: profile(str(sparse_day(w)), "--plot", str(w / "A")), says="--plot")  # fmt: skip
    add("--resume FILE: a verified checkpoint of a future format version", C,
        lambda w: (rewrite_checkpoint(newest(w), version=3), train(*TINY, "--out-dir", str(w / "B"), "--resume", str(newest(w))))[1],
        says="checkpoint format version 3")  # fmt: skip
    add("--resume of an FAE run whose own placement_plan.npz is cut short", C,
        lambda w: (subprocess.run(train(*TINY, *FAE, "--num-batches", "2", "--test-data-size", "64", "--out-dir", str(w / "G")), capture_output=True, check=True),
                   edit(w / "G/placement_plan.npz", lambda r: r[: len(r) // 2]),
                   train(*TINY, *FAE, "--num-batches", "2", "--test-data-size", "64", "--out-dir", str(w / "G"), "--resume"))[2],
        says="placement_plan.npz: not a readable placement plan")  # fmt: skip
    add("--resume of a run whose config.json is not JSON", R,
        lambda w: ((w / "A/config.json").write_text("{ half"), train(*TINY, "--keep-checkpoints", "3", "--out-dir", str(w / "A"), "--resume", "--nepochs", "2"))[1],
        expect="survive", says="config.json: damaged")  # fmt: skip
    add("Taobao: raw file replaced by other content of the same size", W_,
        lambda w: (taobao_world(w), edit(w / "UserBehavior.csv", swap_digit),
                   pipeline("preprocess", "--dataset", "taobao", "--raw", str(w / "UserBehavior.csv"), "--out", str(w / "tb"), "--ts-length", "4", "--points-per-user", "3", "--no-progress"))[2],
        says="from another raw file", keep=["tb/meta.json"])  # fmt: skip
    serving.add_probes(add, C, W_, M)  # issue 37: artifacts, prediction, the serving tier
    p += _i37_ckpt_probes()
    p.extend(scm_probes())  # issue 37: the SSD tier and the run directory (its own block below)
    endings.add_probes(add, sys.modules[__name__])  # issue 46: limits, Ctrl-C, waits, files
    return p


# ===== issue 37 (i37-ckpt): finished runs, sharded checkpoints, resume across world sizes, the
# library's ConfigError. The 2-process cases launch torchrun on 127.0.0.1 (about a minute each).

SLIP37 = [*TINY, "--slipstream", "--slipstream-interval", "6", "--slipstream-warmup", "8",
          "--slipstream-target-skip", "0.3", "--hot-budget", "1KB", "--profile-sample-rate", "0.2",
          "--test-data-size", "256", "--data-size", "1280", "--test-freq", "7"]  # fmt: skip
TWO = [sys.executable, "-m", "dlrm.torchrun", "--standalone", "--nproc_per_node", "2"]
# probe name -> a check of the world after its command ("" when right)
AFTER: dict[str, Callable[[Path], str]] = {}


def _slip_run(w: Path, out: str) -> None:
    subprocess.run(train(*SLIP37, "--out-dir", str(w / out), "--save-model", str(w / f"{out}.pt")),
                   capture_output=True, check=True, cwd=w)  # fmt: skip


def _killed_after_final_checkpoint(w: Path) -> list[str]:
    """Slipstream run S finished; its copy T as if killed right after the final checkpoint."""
    _slip_run(w, "S")
    shutil.copytree(w / "S", w / "T")
    (w / "T/summary.json").unlink()
    return train(*SLIP37, "--out-dir", str(w / "T"), "--save-model", str(w / "T.pt"), "--resume")


def _same_model_files(w: Path) -> str:
    import torch

    a, b = (torch.load(w / f, weights_only=True)["model"] for f in ("S.pt", "T.pt"))
    same = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    s, t = (json.loads((w / d / "summary.json").read_text()) for d in ("S", "T"))
    if not same:
        return "the resumed run's model differs from the uninterrupted run's"
    if (s["test_auc"], s["steps"]) != (t["test_auc"], t["steps"]):
        return f"summary differs: {s['test_auc'], s['steps']} vs {t['test_auc'], t['steps']}"
    return ""


def _two_process_run(w: Path, out: str, *extra: str) -> None:
    """A 2-process run (torchrun) with checkpoints at steps 10 and 20."""
    subprocess.run([*TWO, "-m", "dlrm.train", *TINY, "--num-batches", "20", "--test-freq", "10",
                    "--test-data-size", "256", "--keep-checkpoints", "3", "--out-dir",
                    str(w / out), *extra], capture_output=True, check=True, cwd=w)  # fmt: skip


def _mixed_shards(w: Path) -> list[str]:
    _two_process_run(w, "D")
    steps = sorted((w / "D/checkpoints").iterdir())
    name = "rank_00001-of-00002.pt"
    shutil.copy(steps[0] / name, steps[1] / name)  # step 10's shard into step 20's directory
    return train(*TINY, "--num-batches", "20", "--test-freq", "10", "--test-data-size", "256",
                 "--out-dir", str(w / "E"), "--resume", str(steps[1]))  # fmt: skip


def _library(code: str) -> list[str]:
    """A TrainConfig call; its ConfigError as one line, exit 2 (anything else: a traceback)."""
    wrapper = ("import sys\nfrom dlrm import ConfigError, TrainConfig\ntry:\n    " + code
               + "\nexcept ConfigError as e:\n    sys.stderr.write(f'{e}\\n')\n    sys.exit(2)")  # fmt: skip
    return [sys.executable, "-c", wrapper]


def _i37_ckpt_probes() -> list[Probe]:
    p: list[Probe] = []
    a_files = ("A/summary.json", "A/metrics.jsonl", "A/config.json", "A.model.pt",
               "A/checkpoints/step_000000030.pt")  # fmt: skip
    p.append(Probe("--resume of a finished run: nothing trained or written", R,
                   lambda w: train(*TINY, "--test-freq", "10", "--keep-checkpoints", "3",
                                   "--out-dir", str(w / "A"), "--save-model",
                                   str(w / "A.model.pt"), "--resume"),
                   expect="survive", says="run already finished at step 30; nothing to do",
                   keep=a_files))  # fmt: skip
    p.append(Probe("Slipstream: --resume of a finished run: nothing trained or written", R,
                   lambda w: (_slip_run(w, "S"),
                              train(*SLIP37, "--out-dir", str(w / "S"), "--save-model",
                                    str(w / "S.pt"), "--resume"))[1],
                   expect="survive", says="nothing to do",
                   keep=("S/summary.json", "S/metrics.jsonl", "S.pt")))  # fmt: skip
    name = "Slipstream: killed right after the final checkpoint, --resume: the uninterrupted model"
    p.append(Probe(name, R, _killed_after_final_checkpoint, expect="survive"))
    AFTER[name] = _same_model_files
    p.append(Probe("sharded checkpoint: a rank's shard from step 10 copied into step 20's", C,
                   _mixed_shards, says="rank_00001-of-00002.pt: a shard of another checkpoint"))  # fmt: skip
    p.append(Probe("--placement fae: a 2-process checkpoint resumed by 1 process", R,
                   lambda w: (_two_process_run(w, "H", *FAE),
                              train(*TINY, *FAE, "--num-batches", "20", "--test-freq", "10",
                                    "--test-data-size", "256", "--out-dir", str(w / "H"),
                                    "--resume"))[1],
                   says="not with --placement fae"))  # fmt: skip
    for name_, code in [
        ("learning_rate", "TrainConfig(learning_rate='fast')"),
        ("mini_batch_size", "TrainConfig(mini_batch_size='64')"),
        ("arch_mlp_bot", "TrainConfig(arch_mlp_bot=[13, 'x'])"),
        ("arch_embedding_size", "TrainConfig(arch_embedding_size=(10, None))"),
        ("allow_changed", "TrainConfig(allow_changed=['lr', 3])"),
    ]:
        flag = "--" + name_.replace("_", "-")
        p.append(Probe(f"library: {code}", M, lambda w, c=code: _library(c), says=f"{flag}: "))
    return p


# ===== end of issue 37 (i37-ckpt)


# --- issue 37: the SSD tier and the run directory --------------------------------------------
# (one block: a tiered run is made by each probe that needs one, so the shared world is unchanged)

TIERED = ["--placement", "tiered", "--hot-budget", "2KB", "--profile-sample-rate", "0.2",
          "--scm-cache", "2KB", "--scm-io", "buffered", "--device", "cpu", "--optimizer",
          "adagrad", "--test-freq", "10"]  # fmt: skip
RECORD = 16 + 4096 + 4  # a journal record with its pre-image (embeddings/ssd/journal.py)


def tiered(w: Path, name: str = "T", *extra: str) -> list[str]:
    return train(*TINY, *TIERED, "--out-dir", str(w / name), *extra)


def finished_tiered(w: Path, name: str = "T") -> None:
    subprocess.run(tiered(w, name), capture_output=True, check=True, cwd=ROOT)


def killed_tiered(w: Path) -> None:
    """Tiered run T killed with -9 a moment after its first checkpoint: its journal holds the
    pre-images of the blocks overwritten since."""
    proc = subprocess.Popen(tiered(w, "T", "--data-size", str(64 * 200)), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    metrics = w / "T/metrics.jsonl"
    while proc.poll() is None and not (metrics.is_file() and '"checkpoint"' in metrics.read_text()):
        time.sleep(0.05)
    time.sleep(0.5)
    proc.kill()
    proc.wait()


def cut_journal(w: Path, extra: int) -> None:
    """T's journal cut after half its records (plus `extra` bytes into the next)."""
    path = w / "T/scm/journal.log"
    raw = path.read_bytes()
    records = (len(raw) - 36) // RECORD
    if records < 2:
        raise SystemExit(f"the killed run's journal holds {records} records: kill it later")
    path.write_bytes(raw[: 36 + records // 2 * RECORD + extra])


BACKGROUND: list[subprocess.Popen] = []  # `holding`'s processes, ended before the next probe


def holding(w: Path, argv: list[str], lock: Path) -> None:
    """`argv` started in the background; returns once it holds `lock` (it is ended, if it has not
    ended by itself, before the next probe's world is made: on a loaded machine it can outlive
    its probe and write into the world being removed)."""
    BACKGROUND.append(
        subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    )
    while not (lock.is_file() and lock.read_text().strip()):
        time.sleep(0.05)


def end_background() -> None:
    while BACKGROUND:
        p = BACKGROUND.pop()
        if p.poll() is None:
            p.kill()
        p.wait()


def mounted(options: str) -> Path:
    """A fresh tmpfs (root only), unmounted when the script ends."""
    import atexit

    where = Path(tempfile.mkdtemp(prefix="probe-tmpfs-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], check=True,
                   capture_output=True)  # fmt: skip
    atexit.register(subprocess.run, ["umount", "-l", str(where)], check=False)
    return where


def scm_probes() -> list[Probe]:
    p: list[Probe] = []

    def add(name, section, make, expect="error", says="", keep=()):
        p.append(Probe(name, section, make, expect, says, tuple(keep)))

    rollback = ("T/scm/rows.dat", "T/scm/journal.log")
    for label, extra in [("at a record boundary", 0), ("in the middle of a record", 100)]:
        add(f"SSD tier: --resume after kill -9 with the journal cut {label}", C,
            lambda w, x=extra: (killed_tiered(w), cut_journal(w, x),
                                tiered(w, "T", "--data-size", str(64 * 200), "--resume"))[2],
            says="journal.log: the journal was cut short or replaced")  # fmt: skip
    add("SSD tier: --resume with another run's rows.dat of the same layout", C,
        lambda w: (finished_tiered(w, "T"), finished_tiered(w, "U"),
                   shutil.copy(w / "U/scm/rows.dat", w / "T/scm/rows.dat"),
                   tiered(w, "T", "--nepochs", "2", "--resume"))[3],
        says="belongs to another tier")  # fmt: skip
    add("SSD tier: two runs at once in the same --out-dir", W_,
        lambda w: (holding(w, tiered(w, "T", "--data-size", str(64 * 400)), w / "T/.lock"),
                   tiered(w, "T"))[1],
        says="is in use by another process (process ")  # fmt: skip
    add("SSD tier: two runs at once on the same --scm-dir", W_,
        lambda w: (holding(w, tiered(w, "T", "--data-size", str(64 * 400), "--scm-dir", str(w / "S")), w / "S/.lock"),
                   tiered(w, "U", "--scm-dir", str(w / "S")))[1],
        says="--scm-dir: ")  # fmt: skip
    add("SSD tier: --resume with tier.json removed", W_,
        lambda w: (finished_tiered(w), (w / "T/scm/tier.json").unlink(),
                   tiered(w, "T", "--nepochs", "2", "--resume"))[2],
        says="but no tier.json", keep=rollback)  # fmt: skip
    add("SSD tier: --scm-dir names a file", M,
        lambda w: ((w / "afile").write_text("x"), tiered(w, "T", "--scm-dir", str(w / "afile")))[1],
        says="--scm-dir: ")  # fmt: skip
    add("SSD tier: --scm-dir below a file", M,
        lambda w: ((w / "afile").write_text("x"), tiered(w, "T", "--scm-dir", str(w / "afile/scm")))[1],
        says="--scm-dir: ")  # fmt: skip
    add("SSD tier: --scm-dir on a read-only file system", M,
        lambda w: tiered(w, "T", "--scm-dir", str(mounted("size=64k,ro") / "scm")),
        says="is not writable")  # fmt: skip
    # a disk too small for the tier's file is found before training (dlrm/placement/memory_check.py); a disk
    # that fills up during training is tests/dlrm/test_tiered_training.py's (it needs space at
    # the start, then none)
    add("SSD tier: the tier's disk is smaller than its file", M,
        lambda w: tiered(w, "T", "--scm-dir", str(mounted("size=16k") / "scm")),
        says="use more free space under --scm-dir")  # fmt: skip
    add("Hotline: --hotline-learn-batches longer than the run", M,
        lambda w: train(*TINY, "--placement", "hotline", "--hot-budget", "2KB",
                        "--hotline-learn-batches", "40", "--out-dir", str(w / "H")),
        says="--hotline-learn-batches 40: the run has 30 mini-batches")  # fmt: skip
    return p


# --- end of issue 37's SSD tier block ---------------------------------------------------------


WORLD_PATHS = ("A.model.pt", "A.model.pt/run", "A", "A.model.pt/m.pt", "nowhere", "nowhere.txt",
               "empty.txt", "k2", "kraw/train.txt", "kdata")  # fmt: skip


def other_arch(argv: list[str], flag: str, value: str) -> list[str]:
    i = argv.index(flag)
    return [*argv[: i + 1], value, *argv[i + 2 :]]


def swap_digit(raw: bytearray) -> bytearray:
    """One digit in the middle changed: same size, other content."""
    i = len(raw) // 2
    while not chr(raw[i]).isdigit():
        i += 1
    raw[i] = ord("7") if raw[i] != ord("7") else ord("3")
    return raw


def rewrite_checkpoint(path: Path, **changes) -> None:
    """The checkpoint with `changes`, saved with fresh checksums (so only those changes differ)."""
    from dlrm.checkpoints import format as ckpt

    data = ckpt.load(path)
    data.pop(ckpt.CHECKSUMS, None)
    ckpt.save({**data, **changes}, path)


def taobao_world(w: Path) -> None:
    """A small UserBehavior.csv preprocessed into w/tb."""
    from data_pipeline.taobao import TaobaoOptions, preprocess_taobao
    from data_pipeline.taobao_synthetic import PlantedBehavior, write_user_behavior

    write_user_behavior(w / "UserBehavior.csv", PlantedBehavior(num_users=60, min_events=8,
                                                                max_events=12, seed=3))  # fmt: skip
    preprocess_taobao(
        w / "UserBehavior.csv", w / "tb", TaobaoOptions(ts_length=4, points_per_user=3)
    )


def _evil_pickle(path: Path) -> None:
    """A torch file whose pickle would call os.system if it were unpickled freely."""
    import torch

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {path.parent / 'PWNED'}",))

    torch.save({"format": "hybrid-dlrm-checkpoint", "x": Evil()}, path)


# --- running ---------------------------------------------------------------------------------


def digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def check_one_run(w: Path) -> str:
    """After a resume: metrics.jsonl's steps never go back, and one resume event marks the seam."""
    events = [json.loads(x) for x in (w / "A/metrics.jsonl").read_text().splitlines()]
    steps = [e["step"] for e in events if e["event"] != "resume"]
    resumes = [e for e in events if e["event"] == "resume"]
    if steps != sorted(steps) or len(resumes) != 1:
        return (
            f"metrics.jsonl does not read as one run: steps {steps}, {len(resumes)} resume events"
        )
    return ""


def run_probe(probe: Probe, world: Path, scratch: Path) -> None:
    w = scratch / "w"
    end_background()
    if w.exists():
        shutil.rmtree(w)
    shutil.copytree(world, w, symlinks=True)
    argv = probe.make(w)
    before = {k: digest(w / k) for k in probe.keep}
    t0 = time.perf_counter()
    done, hang = _run_command(probe, argv, w)
    # log records the user asked for with -v are not part of the one line; nor torch's launcher's
    # own log lines (its start-up banner about OMP_NUM_THREADS, W1128 ...)
    others = ("INFO", "  ") if probe.signal is not None else ("INFO",)
    lines = [x for x in done.stderr.strip().splitlines()
             if x.strip() and not x.startswith(others) and not re.match(r"[WIE]\d{4} ", x)]  # fmt: skip
    problems = [f"no end within {probe.timeout:.0f} s"] if hang else []
    codes = {"error": 2, "interrupted": 130, "terminated": 143}
    if probe.expect in codes:
        if done.returncode != codes[probe.expect]:
            problems.append(f"exit {done.returncode}")
        if len(lines) != probe.lines:
            problems.append(f"{len(lines)} lines on stderr")
    else:
        if done.returncode != 0:
            problems.append(f"exit {done.returncode}")
        # what a run that goes on says is a plain line of its output (issue 45: one style), or a
        # warning on stderr where something was skipped
        said = [x for x in lines if ": warning: " in x] + (done.stdout or "").splitlines()
        if probe.says and not any(probe.says in x for x in said):
            problems.append(f"does not say {probe.says!r}")
    if probe.expect != "survive" and probe.says and probe.says not in done.stderr:
        problems.append(f"does not say {probe.says!r}")
    if (
        "Traceback" in done.stderr
        or "weights_only=False" in done.stderr
        or "allow_pickle" in done.stderr
    ):
        problems.append("traceback or unpickling advice")
    changed = [k for k, v in before.items() if digest(w / k) != v]
    if changed:
        problems.append(f"changed: {', '.join(changed)}")
    if (w / "PWNED").exists():
        problems.append("the pickle ran code")
    if probe.name.startswith("metrics.jsonl") and not problems:
        problems += [x for x in [check_one_run(w)] if x]
    if probe.name in AFTER and not problems:
        problems += [x for x in [AFTER[probe.name](w)] if x]
    shown = (
        lines[-1]
        if probe.expect != "survive" and lines
        else next((x for x in lines if ": warning: " in x), lines[-1] if lines else "")
    )
    probe.result = {
        "probe": probe.name, "section": probe.section, "rc": done.returncode,
        "stderr_lines": len(lines), "shown": shown.replace(str(w) + "/", "")[:400],
        "ok": not problems, "problems": problems, "s": round(time.perf_counter() - t0, 1),
        "outcome": endings.classify(done.returncode, done.stderr, problems, hang),
    }  # fmt: skip


def _run_command(probe: Probe, argv: list[str], w: Path):
    """The command's CompletedProcess and whether it hung (killed after `probe.timeout`). A probe
    with a signal runs in a process group of its own, which gets the signal as from a terminal;
    what it printed before the signal is not part of its ending."""
    if probe.signal is None:
        try:
            return subprocess.run(argv, capture_output=True, text=True, cwd=w,
                                  timeout=probe.timeout), False  # fmt: skip
        except subprocess.TimeoutExpired as e:
            err = e.stderr.decode() if isinstance(e.stderr, bytes) else e.stderr or ""
            return subprocess.CompletedProcess(argv, None, "", err), True
    proc = subprocess.Popen(argv, cwd=w, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    try:
        after = endings.send_when(proc, w, probe.signal, probe.timeout)
        return subprocess.CompletedProcess(argv, proc.returncode, "", "".join(after)), False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        return subprocess.CompletedProcess(argv, None, "", ""), True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="run the probes whose name contains this")
    ap.add_argument("--section", help="run the probes whose section contains this")
    ap.add_argument("--markdown", action="store_true", help="print a table instead of JSON")
    ap.add_argument("--keep", type=Path, help="build the world here once and reuse it")
    args = ap.parse_args()
    chosen = [q for q in probes() if (not args.only or args.only in q.name)
              and (not args.section or args.section in q.section)]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="probes-") as tmp:
        world = args.keep or Path(tmp) / "world"
        if not (world / "A/summary.json").exists():
            world.mkdir(parents=True, exist_ok=True)
            build_world(world)
        if not (world / serving.ART / "manifest.json").exists():
            serving.build(world, ROOT)
        for q in chosen:
            run_probe(q, world, Path(tmp))
            print(f"{'ok ' if q.result['ok'] else 'BAD'} [{q.result['outcome']}] {q.name}: "
                  f"{q.result['shown'][:160]}",
                  file=sys.stderr, flush=True)  # fmt: skip
        end_background()  # before the scratch directory goes
    results = [q.result for q in chosen]
    if args.markdown:
        print("| # | section | probe | exit | lines | what the user sees | ok |")
        print("|---|---|---|---|---|---|---|")
        for i, r in enumerate(results, 1):
            ok = "yes" if r["ok"] else f"NO ({r['outcome']}): " + "; ".join(r["problems"])
            shown = r["shown"].replace("|", "\\|")
            print(
                f"| {i} | {r['section']} | {r['probe']} | {r['rc']} | {r['stderr_lines']} | {shown} | {ok} |"
            )
    else:
        outcomes = {o: sum(r["outcome"] == o for r in results) for o in
                    ("ok", "data loss", "silent corruption", "hang", "traceback", "misleading")}  # fmt: skip
        print(json.dumps({"probes": len(results), "ok": sum(r["ok"] for r in results),
                          "outcomes": outcomes, "results": results}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()

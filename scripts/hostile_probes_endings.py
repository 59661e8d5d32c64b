"""Issue #46's probes for scripts/hostile_probes.py: sizes past the machine, Ctrl-C and SIGTERM in
every phase, torchrun's Ctrl-C, locks whose holder has ended, read-only places, and the output
and resume files (outputs onto inputs, device nodes and run files; a plan's JSON beside another
plan; edited decision and config files on resume; a run killed before its first checkpoint).

Each probe is a `Probe` of hostile_probes.py; a signal probe also names when its signal goes
(`Signal`: a piece of stderr, or a file that appears, then the signal to the process group as a
terminal's Ctrl-C sends it). The runner classifies every outcome (`classify`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ENDINGS = "Ends: limits, Ctrl-C, waits"
FILES = "Outputs and resume files"
DEAD = 2**30  # a process id above any pid_max: no such process


@dataclass(frozen=True)
class Signal:
    """When to send `signum` to the command's process group (a terminal's Ctrl-C), or to the
    command's process alone (`group=False`: a scheduler's SIGTERM): once `stderr` has this piece,
    or once a file matching `path` (a pattern relative to the world) exists; `after` s later."""

    signum: int = signal.SIGINT
    stderr: str = ""
    path: str = ""
    after: float = 0.0
    group: bool = True


def classify(rc: int | None, stderr: str, problems: list[str], hang: bool) -> str:
    """One word for what the user got: hang, data loss (a file of theirs changed or gone),
    silent corruption (a check of the files after the command failed), traceback, misleading
    (wrong exit code, line count or words), ok."""
    if hang:
        return "hang"
    if any(p.startswith("changed: ") for p in problems):
        return "data loss"
    if any(p.startswith("after: ") for p in problems):
        return "silent corruption"
    if "Traceback" in stderr:
        return "traceback"
    return "misleading" if problems else "ok"


def send_when(proc: subprocess.Popen, w: Path, when: Signal, deadline_s: float) -> list[str]:
    """Signal `proc`'s group once `when` is reached. Its stderr is read by a thread as it comes:
    returns the list the lines go on filling, and the index of the first line said after the
    signal is sent in its last item's place (the lines before it are progress, not the ending)."""
    lines: list[str] = []
    done = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
        done.set()

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + deadline_s
    if when.stderr:
        while time.monotonic() < deadline and not done.is_set():
            if any(when.stderr in x for x in list(lines)):
                break
            time.sleep(0.02)
    elif when.path:
        # a pattern: a run keeps its last few checkpoints, so step 20's may be gone in a blink
        while time.monotonic() < deadline and proc.poll() is None and not any(w.glob(when.path)):
            time.sleep(0.01)
    time.sleep(when.after)
    before = len(lines)
    try:
        (os.killpg if when.group else os.kill)(proc.pid, when.signum)
    except ProcessLookupError:
        pass
    proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    done.wait(timeout=10)
    return lines[before:]


# --- building blocks ---------------------------------------------------------------------------


def _run(argv: list[str], cwd: Path) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd)
    if done.returncode != 0:
        raise SystemExit(f"probe setup failed: {argv}\n{done.stderr}")


def big_raw(w: Path, lines: int = 250_000) -> Path:
    """A Kaggle train.txt large enough that preprocessing starts its workers and takes seconds."""
    from data_pipeline.synthetic_raw import SyntheticSpec, write_kaggle

    write_kaggle(w / "bigraw", lines, 0, SyntheticSpec(seed=1, vocab_cap=1000))
    return w / "bigraw/train.txt"


def big_data(w: Path, pipeline) -> Path:
    raw = big_raw(w, 150_000)
    _run(pipeline("preprocess", "--dataset", "kaggle", "--raw", str(raw), "--out",
                  str(w / "bigdata"), "--max-ind-range", "1000", "--no-progress"), w)  # fmt: skip
    return w / "bigdata"


def hold_with_ended_taker(path: Path) -> None:
    """`path` flocked by a background process (as a child that inherited its parent's lock), the
    file naming a process that has ended. The holder goes after 120 s."""
    path.parent.mkdir(parents=True, exist_ok=True)
    code = (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(path)!r}, os.O_RDWR | os.O_CREAT, 0o644)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        f"os.ftruncate(fd, 0); os.pwrite(fd, b'{DEAD}\\n', 0)\n"
        "print('held', flush=True); time.sleep(120)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "held"


def read_only_copy(w: Path, name: str, mounted: Callable[[str], Path]) -> Path:
    """A copy of w/name on a tmpfs remounted read-only (root only)."""
    where = mounted("size=64m")
    shutil.copytree(w / name, where / name)
    subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True, capture_output=True)
    return where / name


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data, indent=1))


def _nothing_at(*names: str) -> Callable[[Path], str]:
    """An `after` check: none of `names` (relative to the world) exists, nor a temporary of one."""

    def check(w: Path) -> str:
        left = [n for n in names if (w / n).exists()]
        left += [p.name for n in names for p in (w / n).parent.glob(f".{Path(n).name}*")]
        return f"after: left behind: {', '.join(left)}" if left else ""

    return check


def killed_before_first_checkpoint(w: Path, argv: list[str], run: Path) -> None:
    """`argv` started and killed with -9 once its run directory has config.json."""
    p = subprocess.Popen(argv, cwd=w, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while p.poll() is None and not (run / "config.json").is_file():
        time.sleep(0.05)
    p.kill()
    p.wait()


def add_probes(add, h) -> None:
    """`add(name, section, make, expect, says, keep, signal=None, timeout=600, after=None,
    lines=1)`; `h` is hostile_probes (its command makers and world). `expect` "interrupted" or
    "terminated": exit 130 or 143 and `lines` lines of our own (one per rank under torchrun)."""
    train, pipeline, TINY, CRITEO, FAE = h.train, h.pipeline, h.TINY, h.CRITEO, h.FAE
    perf = lambda *a: [sys.executable, "-m", "perfmodel", *a]  # noqa: E731
    report = lambda *a: [sys.executable, "-m", "dlrm.report", *a]  # noqa: E731
    long_run = [*TINY[:-6], "--data-size", str(64 * 20000), "--test-data-size", "128",
                "--test-freq", "20", "--print-freq", "0", "--progress", "false"]  # fmt: skip

    # --- limits before allocation
    for label, argv, says in [
        ("train --multi-hot-sizes 1000000", train(*TINY, "--multi-hot-sizes", "1000000"), "--multi-hot-sizes: bags of"),
        ("train --mini-batch-size 1000000000", train(*TINY[:-8], "--mini-batch-size", "1000000000", "--test-mini-batch-size", "64"), "--mini-batch-size"),
        ("train --test-mini-batch-size 10000000000", train(*TINY, "--test-mini-batch-size", "10000000000"), "--test-mini-batch-size"),
        ("train a table of 1e11 rows", train(*h.other_arch(TINY, "--arch-embedding-size", "100000000000-10")), "--arch-embedding-size"),
        ("train --threads 100000", train(*TINY, "--threads", "100000"), "--threads"),
        ("train DCN of rank 1e8", train(*TINY, "--arch-interaction-op", "dcn", "--dcn-low-rank-dim", "100000000"), "--placement"),
        ("perfmodel plan --multi-hot-sizes 1000000", perf("plan", *TINY, "--multi-hot-sizes", "1000000"), "--multi-hot-sizes: bags of"),
        ("perfmodel plan --mini-batch-size 1000000000", perf("plan", *TINY[:-8], "--mini-batch-size", "1000000000", "--test-mini-batch-size", "64"), "--mini-batch-size"),
    ]:  # fmt: skip
        add(f"limits: {label}", ENDINGS, lambda w, a=argv: [*a, "--out-dir", str(w / "B")],
            says=says, timeout=180)  # fmt: skip
    add("limits: data_pipeline multi-hot --sizes 1000000", ENDINGS,
        lambda w: pipeline("multi-hot", str(w / "kdata"), "--sizes", "1000000", "--out", str(w / "bags")),
        says="--sizes: bags of", timeout=180)  # fmt: skip

    # --- Ctrl-C and SIGTERM in each phase: one line, 130 / 143, files consistent
    add("Ctrl-C in data_pipeline preprocess (its workers get it too)", ENDINGS,
        lambda w: pipeline("-v", "preprocess", "--dataset", "kaggle", "--raw", str(big_raw(w)), "--out",
                           str(w / "pp"), "--workers", "2", "--block-mb", "1", "--no-progress"),
        expect="interrupted", says="interrupted; the parts finished so far are kept",
        signal=Signal(stderr="day_0: not written yet"))  # fmt: skip
    add("SIGTERM in data_pipeline preprocess", ENDINGS,
        lambda w: pipeline("-v", "preprocess", "--dataset", "kaggle", "--raw", str(big_raw(w)), "--out",
                           str(w / "pp"), "--workers", "2", "--block-mb", "1", "--no-progress"),
        expect="terminated", says="terminated (SIGTERM)",
        signal=Signal(signal.SIGTERM, stderr="day_0: not written yet"))  # fmt: skip
    add("Ctrl-C while dlrm.train preprocesses", ENDINGS,
        lambda w: train(*CRITEO, "--data-set", "kaggle", "--raw-data-file", str(big_raw(w)),
                        "--processed-data-file", str(w / "pp"), "--max-ind-range", "1000", "--out-dir", str(w / "K")),
        expect="interrupted", says="interrupted before the first checkpoint",
        signal=Signal(stderr="preprocessing kaggle", after=0.5))  # fmt: skip
    add("Ctrl-C in multi-hot materialisation", ENDINGS,
        lambda w: pipeline("-v", "multi-hot", str(big_data(w, pipeline)), "--sizes", "12", "--out", str(w / "bags")),
        expect="interrupted", says="the partial bags were removed",
        signal=Signal(stderr="multi-hot bags: day_0 done"), after=_no_bags)  # fmt: skip
    add("Ctrl-C in perfmodel plan (while it predicts)", ENDINGS,
        lambda w: perf("plan", *h.other_arch(TINY, "--arch-embedding-size", "40000000-20000000-500-7"),
                       "--memory-limit", "1500MB", "--data-size", "400000", "--out-dir", str(w / "B")),
        expect="interrupted", says="interrupted; nothing written",
        signal=Signal(stderr="predicting the step time", after=1))  # fmt: skip
    for sig, word in ((signal.SIGINT, "interrupted"), (signal.SIGTERM, "terminated")):
        add(f"{signal.Signals(sig).name} while training, after a checkpoint", ENDINGS,
            lambda w: train(*long_run, "--out-dir", str(w / "L")), expect=word,
            says="; the last checkpoint is ", signal=Signal(sig, path="L/checkpoints/step_*.pt"),
            after=_resume_command_resumes)  # fmt: skip
    add("Ctrl-C under torchrun (2 ranks), after a checkpoint", ENDINGS,
        lambda w: [*h.TWO, "-m", "dlrm.train", *long_run, "--out-dir", str(w / "L")],
        expect="interrupted", says="resume with: python -m dlrm.torchrun ", lines=2,
        signal=Signal(path="L/checkpoints/step_*", after=0.5))  # fmt: skip
    # the serving commands: their writes are atomic, so nothing is left half made (a profile is
    # done in a second or two: tests/embeddings/test_profile.py interrupts its plot instead)
    serving = h.serving
    add("Ctrl-C in quantize --emb-precision auto (the precision search)", ENDINGS,
        lambda w: [sys.executable, "-m", "hybrid_dlrm.serving.quantize", str(w / "serve_run"),
                   "--emb-precision", "auto", "--out", str(w / "art/auto")],
        expect="interrupted", says="interrupted; nothing written",
        signal=Signal(after=6), after=_nothing_at("art/auto"))  # fmt: skip
    add("SIGTERM in serving.predict over a large file", ENDINGS,
        lambda w: serving.predict(w, "--out", str(w / "p.csv"),
                                  data=str(big_raw(w, 1_000_000).relative_to(w))),
        expect="terminated", says="terminated (SIGTERM); no file written",
        signal=Signal(signal.SIGTERM, path=".p.csv.tmp-*", after=0.3),
        after=_nothing_at("p.csv"))  # fmt: skip
    add("SIGTERM to torchrun's launcher alone (a scheduler), after a checkpoint", ENDINGS,
        lambda w: [*h.TWO, "-m", "dlrm.train", *long_run, "--out-dir", str(w / "L")],
        expect="terminated", says="resume with: python -m dlrm.torchrun ", lines=2,
        signal=Signal(signal.SIGTERM, path="L/checkpoints/step_*", after=0.5, group=False))  # fmt: skip
    add("a mistyped flag under torchrun (2 ranks)", ENDINGS,
        lambda w: [*h.TWO, "-m", "dlrm.train", "--num-batchs", "3"],
        says="did you mean --num-batches", lines=2, timeout=120)  # fmt: skip

    # --- waits that end
    add("multi-hot: its lock held though the process that took it has ended", ENDINGS,
        lambda w: (hold_with_ended_taker(w / ".bags.lock"),
                   pipeline("multi-hot", str(w / "kdata"), "--sizes", "3", "--out", str(w / "bags")))[1],
        says="that took it has ended", timeout=60)  # fmt: skip
    add("train: the run directory's lock held though its taker has ended", ENDINGS,
        lambda w: (hold_with_ended_taker(w / "B/.lock"), train(*TINY, "--out-dir", str(w / "B")))[1],
        says="that took it has ended", timeout=60)  # fmt: skip
    add("multi-hot beside a preprocessed directory on a read-only file system", ENDINGS,
        lambda w: pipeline("multi-hot", str(read_only_copy(w, "kdata", h.mounted)), "--sizes", "3"),
        says="--multi-hot-materialize false", timeout=60)  # fmt: skip
    add("train --multi-hot-sizes, the preprocessed directory read-only", ENDINGS,
        lambda w: train(*CRITEO, "--data-set", "kaggle", "--processed-data-file",
                        str(read_only_copy(w, "kdata", h.mounted)), "--multi-hot-sizes", "3",
                        "--num-batches", "2", "--out-dir", str(w / "K")),
        says="--multi-hot-materialize false", timeout=60)  # fmt: skip

    # --- outputs onto inputs, device nodes and run files; resume files (other helpers' fixes)
    add("--save-model onto the training data", FILES,
        lambda w: h.kaggle(w, "--num-batches", "2", "--save-model", str(w / "kdata/day_0.sparse.npy")),
        says="--save-model", keep=["kdata/day_0.sparse.npy"])  # fmt: skip
    add("--save-model onto the run's own metrics.jsonl", FILES,
        lambda w: train(*TINY, "--out-dir", str(w / "A"), "--resume", "--nepochs", "2",
                        "--save-model", str(w / "A/metrics.jsonl")),
        says="--save-model", keep=["A/metrics.jsonl"])  # fmt: skip
    add("--save-model /dev/full (a device node)", FILES,
        lambda w: train(*TINY, "--num-batches", "2", "--out-dir", str(w / "B"), "--save-model", "/dev/full"),
        says="--save-model")  # fmt: skip
    add("dlrm.report --out onto the run's metrics.jsonl", FILES,
        lambda w: report(str(w / "A"), "--out", str(w / "A/metrics.jsonl")),
        says="--out", keep=["A/metrics.jsonl"])  # fmt: skip
    add("--placement-plan plan.txt beside another plan's plan.json", FILES,
        lambda w: train(*TINY, *FAE, "--num-batches", "2", "--out-dir", str(w / "B"),
                        "--profile-file", str(w / "profile.npz"), "--placement-plan", str(w / "plan.txt")),
        says="--placement-plan", keep=["plan.json", "plan.npz"])  # fmt: skip
    add("--resume after config.json was edited (another --seed)", FILES,
        lambda w: (edit_json(w / "A/config.json", seed=7),
                   train(*TINY, "--out-dir", str(w / "A"), "--resume", "--nepochs", "2"))[1],
        says="config.json", keep=["A/metrics.jsonl"])  # fmt: skip
    add("--resume after placement_decision.json was edited", FILES,
        lambda w: (subprocess.run(train(*TINY, "--placement", "auto", "--test-freq", "10", "--out-dir", str(w / "P")),
                                  capture_output=True, check=True, cwd=w),
                   (w / "P/summary.json").unlink(),
                   edit_json(w / "P/placement_decision.json", chosen="host", settings={"placement": "host"}),
                   train(*TINY, "--placement", "auto", "--test-freq", "10", "--out-dir", str(w / "P"), "--resume"))[3],
        says="placement_decision.json")  # fmt: skip
    add("killed -9 before the first checkpoint, then --resume", FILES,
        lambda w: (killed_before_first_checkpoint(w, train(*TINY, "--out-dir", str(w / "L")), w / "L"),
                   train(*TINY, "--out-dir", str(w / "L"), "--resume"))[1],
        expect="survive", says="yet: starting from the beginning")  # fmt: skip


# --- checks after a command (hostile_probes.AFTER) ------------------------------------------------


def _no_bags(w: Path) -> str:
    left = [x.name for x in w.iterdir() if x.name.startswith((".bags.tmp", "bags"))]
    return f"after: left behind {left}" if left else ""


def _resume_command_resumes(w: Path) -> str:
    from dlrm.checkpoints import format as ckpt

    found = ckpt.list_checkpoints(w / "L/checkpoints")
    leftovers = [x.name for x in (w / "L/checkpoints").iterdir() if x not in found]
    return f"after: temporaries left beside the checkpoints: {leftovers}" if leftovers else ""

"""The output rule (hybrid_dlrm/common/outputs.py), cell by cell: every output flag of every
command against every kind of target, through the command's own `main` in-process.

A refused cell is the exact one line (exit code 2) and the target, the inputs and the run's files
byte for byte as they were. An accepted cell is the command passing its output check: the work
after it is replaced by a sentinel (`Accepted`), so no cell trains, measures or preprocesses;
the writers' atomic replacement is tested with each writer. `TABLE` below is the decision of
every cell, and docs/integrity.md shows it (`test_the_docs_show_this_table` keeps them equal).

Codes: `ok` accepted (a new file, or one this product wrote for the purpose, replaced);
`read` accepted as an input (`--profile-file`, `--placement-plan`: an existing file is read,
never written, its reader checks it); `fifo` / `dir` / `file` refused as the wrong kind of node;
`link` refused as a symbolic link; `name` refused as not naming a file pair (X.npz, X.json); `is` / `inside` / `hard` refused as the command's input or
run file (by path, inside a protected directory, by inode); `exists` refused without
--overwrite; `full` a non-empty directory not made by this product for the purpose; `-` no such
target for this flag.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from hybrid_dlrm.common.outputs import png_marker

COLUMNS = ["fifo", "directory", "symlink", "input", "hard link to input", "metrics.jsonl",
           "summary.json", "config.json", "unrelated file", "unrelated --overwrite", "ours",
           "ours --overwrite", "new"]  # fmt: skip

# row: flag, then the code of each column, in COLUMNS' order
TABLE = {
    "dlrm.train --save-model":      "fifo dir link is hard is is is exists ok ok ok ok",
    "dlrm.train --profile-file":    "fifo dir link is hard is is is read read read read ok",
    "dlrm.train --placement-plan":  "fifo dir link name hard name is is read read read read ok",
    "dlrm.train --perf-log":        "fifo full link file file file file file file file ok ok ok",
    "dlrm.train --out-dir":         "fifo full link file file - - - file file ok ok ok",
    "dlrm.report --out":            "fifo dir link is hard is is is exists ok ok ok ok",
    "embeddings.profile --out":     "fifo dir link is hard - - - exists ok ok ok ok",
    "embeddings.profile --plot":    "fifo dir link is hard - - - exists ok ok ok ok",
    "serving.predict --out":        "fifo dir link is hard - - - exists ok exists ok ok",
    "serving.quantize --out":       "fifo full link full file file file file file file full full ok",
    "data_pipeline preprocess --out": "fifo full link file file - - - file file ok ok ok",
    "data_pipeline synth --out":    "fifo ok link - - - - - file file ok ok ok",
    "data_pipeline synth (train.txt)": "fifo dir link - - - - - exists ok exists ok ok",
    "data_pipeline multi-hot --out": "fifo full link is file - - - file file ok ok ok",
    "perfmodel microbench --out":   "fifo full link - - - - - file file ok ok ok",
    "perfmodel report --out":       "fifo full link - - - - - file file ok ok ok",
    "perfmodel fit --model":        "fifo dir link inside hard - - - exists ok ok ok ok",
    "scripts bench --out (JSON)":   "fifo dir link - - - - - exists ok - - ok",
}  # fmt: skip


class Accepted(BaseException):
    """Raised where a command's work would begin: its output check passed. A BaseException, so
    that no command's own `except` turns it into an exit code."""


def _accept(*args, **kwargs):
    raise Accepted


# --- the world a row runs in -----------------------------------------------------------------


class World:
    """A command's inputs and a run directory, made fresh for each cell."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir()
        self.input = root / "in" / "input.npy"
        self.input.parent.mkdir()
        np.save(self.input, np.zeros((4, 3), dtype=np.int64))
        self.input_dir = root / "in" / "dataset"
        self.input_dir.mkdir()
        (self.input_dir / "meta.json").write_text('{"made": "elsewhere"}\n')
        self.run = root / "run"
        self.run.mkdir()
        for name in ("config.json", "summary.json"):
            (self.run / name).write_text('{"seed": 1}\n')
        (self.run / "metrics.jsonl").write_text('{"event": "train", "step": 1, "loss": 0.5}\n')
        self.cells = root / "cells"
        self.cells.mkdir()

    def snapshot(self) -> dict[Path, bytes]:
        """Every regular file under the world (FIFOs are never opened)."""
        out = {}
        for p in sorted(self.root.rglob("*")):
            if p.is_file() and not p.is_symlink():
                out[p] = p.read_bytes()
        return out


def _plan(path: Path) -> None:
    from embeddings.plan import FORMAT

    meta = {"format": FORMAT, "version": 2}
    np.savez(path.with_suffix(".npz"), meta=np.array(json.dumps(meta)))
    path.with_suffix(".json").write_text(json.dumps(meta))


def _profile(path: Path) -> None:
    from embeddings.profile import AccessProfiler

    profiler = AccessProfiler([5, 3], ["a", "b"])
    profiler.add_rows(np.array([[0, 1], [2, 1]]))
    profiler.finish().save(path)


def _png(name: str):
    def make(path: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from hybrid_dlrm.common.outputs import Purpose

        fig = plt.figure(figsize=(1, 1))
        fig.savefig(path, format="png", metadata=png_marker(Purpose(name)))
        plt.close(fig)

    return make


def _model(path: Path) -> None:
    import torch

    from dlrm.checkpoints.format import FORMAT

    torch.save({"format": FORMAT, "version": 2, "arch": {}, "model": {}}, path)


def _directory_with(name: str, text: str = "{}\n"):
    def make(path: Path) -> None:
        path.mkdir()
        (path / name).write_text(text)

    return make


def _text(path: Path) -> None:
    path.write_text("written before\n")


# --- the rows: how each command is run, and where its work begins ----------------------------

TINY = ["--arch-embedding-size", "60-40-500-7", "--arch-sparse-feature-size", "4",
        "--arch-mlp-bot", "13-16-4", "--arch-mlp-top", "16-1", "--mini-batch-size", "64",
        "--data-size", "640", "--test-data-size", "64", "--progress", "false"]  # fmt: skip


def _train(flag: str, extra: tuple[str, ...] = ()):
    def run(w: World, target: Path, overwrite: bool, monkeypatch) -> int:
        import dlrm.compose
        from dlrm.train import main

        monkeypatch.setattr(dlrm.compose, "DirectoryLock", _accept)
        argv = [*TINY, *extra, "--load-model", str(w.input)]
        argv += ["--out-dir", str(target)] if flag == "--out-dir" else ["--out-dir", str(w.run)]
        if flag != "--out-dir":
            argv += [flag, str(target)]
        return main(argv + (["--overwrite"] if overwrite else []))

    return run


def _report(w: World, target: Path, overwrite: bool, monkeypatch) -> int:
    import dlrm.report

    monkeypatch.setattr(dlrm.report, "read_run", _accept)
    argv = [str(w.run), "--out", str(target)]
    return dlrm.report.main(argv + (["--overwrite"] if overwrite else []))


def _profile_cli(flag: str):
    def run(w: World, target: Path, overwrite: bool, monkeypatch) -> int:
        import embeddings.profile

        monkeypatch.setattr(embeddings.profile, "profile_npy_files", _accept)
        argv = [str(w.input), flag, str(target)]
        return embeddings.profile.main(argv + (["--overwrite"] if overwrite else []))

    return run


def _predict(w: World, target: Path, overwrite: bool, monkeypatch) -> int:
    from hybrid_dlrm.serving import predict
    from hybrid_dlrm.serving.predictor import Predictor

    monkeypatch.setattr(Predictor, "load", _accept)
    argv = ["--model", str(w.root / "artifact"), "--data", str(w.input), "--out", str(target)]
    return predict.main(argv + (["--overwrite"] if overwrite else []))


def _quantize(w: World, target: Path, overwrite: bool, monkeypatch) -> int:
    from hybrid_dlrm.serving import quantize

    monkeypatch.setattr(quantize, "export", _accept)
    return quantize.main([str(w.run), "--out", str(target)])


def _data_pipeline(argv_of, work: str, has_overwrite: bool = False):
    def run(w: World, target: Path, overwrite: bool, monkeypatch) -> int:
        import data_pipeline.__main__ as cli

        monkeypatch.setattr(cli, work, _accept)
        return cli.main(
            argv_of(w, target) + (["--overwrite"] if overwrite and has_overwrite else [])
        )

    return run


def _perfmodel(argv_of, work: str, has_overwrite: bool = False):
    def run(w: World, target: Path, overwrite: bool, monkeypatch) -> int:
        import perfmodel.__main__ as cli

        monkeypatch.setattr(cli, work, _accept)
        return cli.main(
            argv_of(w, target) + (["--overwrite"] if overwrite and has_overwrite else [])
        )

    return run


def _bench(w: World, target: Path, overwrite: bool, monkeypatch) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    try:
        from _shared import check_bench_out
    finally:
        sys.path.pop(0)
    try:
        check_bench_out(target.parent, [target.name], overwrite, "bench_x.py")
    except SystemExit as e:
        return e.code
    raise Accepted


# each row: (run, stderr prefix, target name in its cell, protected label of `input`, make ours)
ROWS = {
    "dlrm.train --save-model": (_train("--save-model"), "python -m dlrm.train: error: ", "m.pt", "--load-model", _model),
    "dlrm.train --profile-file": (_train("--profile-file", ("--placement", "fae")), "python -m dlrm.train: error: ", "p.npz", "--load-model", _profile),
    "dlrm.train --placement-plan": (_train("--placement-plan", ("--placement", "fae")), "python -m dlrm.train: error: ", "plan.npz", "--load-model", _plan),
    "dlrm.train --perf-log": (_train("--perf-log"), "python -m dlrm.train: error: ", "perf", "--load-model", _directory_with("trace-rank0.trace.json")),
    "dlrm.train --out-dir": (_train("--out-dir"), "python -m dlrm.train: error: ", "r", "--load-model", _directory_with("metrics.jsonl")),
    "dlrm.report --out": (_report, "python -m dlrm.report: error: ", "c.png", "run {run}'s metrics.jsonl", _png("report PNG")),
    "embeddings.profile --out": (_profile_cli("--out"), "python -m embeddings.profile: error: ", "p.npz", "the input", _profile),
    "embeddings.profile --plot": (_profile_cli("--plot"), "python -m embeddings.profile: error: ", "p.png", "the input", _png("profile plot PNG")),
    "serving.predict --out": (_predict, "python -m hybrid_dlrm.serving.predict: error: ", "p.csv", "--data", _text),
    "serving.quantize --out": (_quantize, "python -m hybrid_dlrm.serving.quantize: error: ", "art", "the source", _directory_with("manifest.json")),
    "data_pipeline preprocess --out": (_data_pipeline(lambda w, t: ["preprocess", "--dataset", "kaggle", "--raw", str(w.input), "--out", str(t)], "preprocess"), "python -m data_pipeline preprocess: error: ", "d", "--raw", _directory_with("meta.json")),
    "data_pipeline synth --out": (_data_pipeline(lambda w, t: ["synth", "--layout", "kaggle", "--lines", "5", "--out", str(t)], "write_kaggle", True), "python -m data_pipeline synth: error: ", "raw", None, _directory_with("day_0")),
    "data_pipeline synth (train.txt)": (_data_pipeline(lambda w, t: ["synth", "--layout", "kaggle", "--lines", "5", "--out", str(t.parent)], "write_kaggle", True), "python -m data_pipeline synth: error: ", "train.txt", None, _text),
    "data_pipeline multi-hot --out": (_data_pipeline(lambda w, t: ["multi-hot", str(w.input_dir), "--sizes", "2", "--out", str(t)], "_multi_hot"), "python -m data_pipeline multi-hot: error: ", "mh", "the preprocessed directory", _directory_with("meta.json")),
    "perfmodel microbench --out": (_perfmodel(lambda w, t: ["microbench", "--out", str(t)], "_microbench"), "python -m perfmodel microbench: error: ", "mb", None, _directory_with("microbench.json")),
    "perfmodel report --out": (_perfmodel(lambda w, t: ["report", "--out", str(t)], "_report"), "python -m perfmodel report: error: ", "rep", None, _directory_with("report.json")),
    "perfmodel fit --model": (_perfmodel(lambda w, t: ["fit", "--bench", str(w.input.parent), "--model", str(t)], "_fit", True), "python -m perfmodel fit: error: ", "pm.json", "--bench", lambda p: p.write_text('{"format": "hybrid-perfmodel", "version": 1}')),
    "scripts bench --out (JSON)": (_bench, "bench_x.py: error: ", "bench.json", None, None),
}  # fmt: skip

PURPOSES = {
    "dlrm.train --save-model": "model file", "dlrm.train --profile-file": "access profile",
    "dlrm.train --placement-plan": "placement plan", "dlrm.train --perf-log": "perf trace directory",
    "dlrm.train --out-dir": "run directory", "dlrm.report --out": "report PNG",
    "embeddings.profile --out": "access profile", "embeddings.profile --plot": "profile plot PNG",
    "serving.predict --out": "predictions CSV", "serving.quantize --out": "artifact directory",
    "data_pipeline preprocess --out": "dataset directory",
    "data_pipeline synth --out": "directory of raw files",
    "data_pipeline synth (train.txt)": "synthetic raw file",
    "data_pipeline multi-hot --out": "dataset directory",
    "perfmodel microbench --out": "microbenchmark directory",
    "perfmodel report --out": "performance report directory",
    "perfmodel fit --model": "performance model", "scripts bench --out (JSON)": "benchmark output",
}  # fmt: skip
IDENTIFIED = {r for r in ROWS if r not in ("serving.predict --out", "serving.quantize --out",
              "data_pipeline synth (train.txt)", "scripts bench --out (JSON)")}  # fmt: skip


def _input(w: World, row: str) -> tuple[Path, Path, str, Path]:
    """The row's input: the path the `input` column names, the file a hard link is made to,
    and the label and path the refusal names."""
    if row == "dlrm.report --out":
        m = w.run / "metrics.jsonl"
        return m, m, f"run {w.run}'s metrics.jsonl", m
    if row == "serving.quantize --out":
        return w.run, w.run / "metrics.jsonl", "the source's metrics.jsonl", w.run / "metrics.jsonl"
    if row == "data_pipeline multi-hot --out":
        d = w.input_dir
        return d, d / "meta.json", "the preprocessed directory", d
    if row == "perfmodel fit --model":
        return w.input.parent / "kernels.jsonl", w.input, "--bench", w.input.parent
    return w.input, w.input, ROWS[row][3], w.input


def _flag(row: str) -> str:
    return next((t for t in row.split() if t.startswith("--")), "--out")


def _target(w: World, row: str, column: str) -> Path | None:
    """The path the cell names, made as the column says; None for `-`."""
    name, make_ours = ROWS[row][2], ROWS[row][4]
    cell = w.cells / column.replace(" ", "_")
    cell.mkdir()
    target = cell / name
    if column == "fifo":
        os.mkfifo(target)
    elif column == "directory":
        target.mkdir()
        (target / "mine.txt").write_text("mine\n")
    elif column == "symlink":
        (cell / "victim").write_text("mine\n")
        target.symlink_to(cell / "victim")
    elif column == "input":
        target = _input(w, row)[0]
        if not target.exists():
            target.write_text("{}\n")
    elif column == "hard link to input":
        os.link(_input(w, row)[1], target)
    elif column in ("metrics.jsonl", "summary.json", "config.json"):
        target = w.run / column
    elif column.startswith("unrelated"):
        target.write_text("mine\n")
    elif column.startswith("ours"):
        make_ours(target)
    return target


def _expected(row: str, code: str, w: World, target: Path, column: str) -> str:
    flag, purpose = _flag(row), PURPOSES[row]
    ours = f" and is not a {purpose} this product made" if row in IDENTIFIED else ""
    if column in ("metrics.jsonl", "summary.json", "config.json"):
        whose = {"serving.quantize --out": "the source's", "dlrm.report --out": f"run {w.run}'s"}
        label, protected = whose.get(row, "the run's") + f" {column}", w.run / column
    else:
        _, _, label, protected = _input(w, row)
    kinds = {"fifo": "a FIFO", "dir": "a directory", "file": "a regular file"}
    never = "which is never written over; choose another name"
    lines = {
        "link": f"{target} is a symbolic link, which is never written through or replaced; "
        "name the file itself",
        "is": f"{target} is {label} {protected}, {never}",
        "inside": f"{target} is inside {label} {protected}, {never}",
        "hard": f"{target} is a hard link to {label} {protected}, {never}",
        "exists": f"{target} already exists{ours}; pass --overwrite to replace it, or choose "
        "another name",
        "full": f"{target} already exists (a directory, not empty){ours}; choose another name "
        "or remove it (--overwrite never deletes a directory)",
        "name": f"{target} is not a {purpose} name: a {purpose} is the pair X.npz and X.json; "
        f"name {target.with_suffix('.npz')} (or {target.with_suffix('')})",
    }
    if code in kinds:
        return f"{flag}: {target} is {kinds[code]}; expected the name of a {purpose}"
    return f"{flag}: {lines[code]}"


@pytest.mark.parametrize("row", list(TABLE))
def test_every_cell_is_its_one_line_refusal_or_passes(row, tmp_path, capsys, monkeypatch):
    run, prefix = ROWS[row][0], ROWS[row][1]
    codes = TABLE[row].split()
    assert len(codes) == len(COLUMNS), row
    failures = []
    for column, code in zip(COLUMNS, codes):
        if code == "-":
            continue
        w = World(tmp_path / column.replace(" ", "_"))
        if column.startswith("ours") and ROWS[row][4] is None:
            continue
        target = _target(w, row, column)
        before = w.snapshot()
        overwrite = column.endswith("--overwrite")
        try:
            rc = run(w, target, overwrite, monkeypatch)
            outcome = "refused"
        except SystemExit as e:  # a parser's error
            rc, outcome = e.code, "refused"
        except Accepted:
            rc, outcome = 0, "accepted"
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.startswith(prefix)]
        if code in ("ok", "read"):
            if outcome != "accepted":
                failures.append(f"{column}: expected accepted, got rc {rc}: {err.strip()}")
        else:
            want = prefix + _expected(row, code, w, target, column)
            if rc != 2 or lines != [want]:
                failures.append(f"{column}: expected\n  {want}\ngot rc {rc}:\n  {err.strip()}")
        if w.snapshot() != before:
            failures.append(f"{column}: files changed")
    assert not failures, f"{row}:\n" + "\n".join(failures)


def test_a_placement_plan_is_named_by_one_stem(tmp_path, capsys, monkeypatch):
    """`--placement-plan foo.txt` wrote foo.npz and over an unrelated foo.json beside it."""
    import dlrm.compose
    from dlrm.train import main

    monkeypatch.setattr(dlrm.compose, "DirectoryLock", _accept)
    other = tmp_path / "foo.json"
    other.write_text('{"mine": true}\n')
    argv = [*TINY, "--placement", "fae", "--out-dir", str(tmp_path / "run")]
    prog = "python -m dlrm.train: error: --placement-plan: "
    assert main([*argv, "--placement-plan", str(tmp_path / "foo.txt")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"{prog}{tmp_path / 'foo.txt'} is not a placement plan name: a placement plan is the "
        f"pair X.npz and X.json; name {tmp_path / 'foo.npz'} (or {tmp_path / 'foo'})"
    )
    for name in ("foo", "foo.npz", "foo.json"):  # the same pair, however it is named
        assert main([*argv, "--placement-plan", str(tmp_path / name)]) == 2
        assert capsys.readouterr().err.strip() == (
            f"{prog}{other} already exists and is not a placement plan this product made; "
            "pass --overwrite to replace it, or choose another name"
        )
    assert other.read_text() == '{"mine": true}\n' and not (tmp_path / "foo.npz").exists()
    with pytest.raises(Accepted):  # with --overwrite the pair may be written
        main([*argv, "--placement-plan", str(tmp_path / "foo"), "--overwrite"])


def test_report_replaces_its_own_png_and_never_a_run_file(tmp_path, capsys):
    """`dlrm.report RUN --out RUN/metrics.jsonl` replaced the run's metrics with a PNG."""
    pytest.importorskip("matplotlib")
    from dlrm.report import REPORT_PNG, main

    w = World(tmp_path / "w")
    metrics = (w.run / "metrics.jsonl").read_bytes()
    assert main([str(w.run), "--out", str(w.run / "metrics.jsonl")]) == 2
    assert (w.run / "metrics.jsonl").read_bytes() == metrics
    capsys.readouterr()
    out = w.run / "curves.png"
    assert main([str(w.run)]) == 0 and REPORT_PNG.identify(out)
    first = out.stat().st_ino
    assert main([str(w.run)]) == 0  # drawn again: its own PNG replaced, a new file
    assert REPORT_PNG.identify(out) and out.stat().st_ino != first


def test_identities_read_only_what_they_need(tmp_path):
    """Each identity knows its own files and nothing else, damaged ones included."""
    from dlrm.checkpoints.format import MODEL_FILE
    from embeddings.plan import PLAN_FILES
    from embeddings.profile import PROFILE_FILE

    _model(tmp_path / "m.pt")
    _plan(tmp_path / "plan")
    _profile(tmp_path / "p.npz")
    (tmp_path / "junk").write_bytes(os.urandom(300))
    (tmp_path / "cut.npz").write_bytes((tmp_path / "p.npz").read_bytes()[:100])
    checks = {
        MODEL_FILE: "m.pt",
        PLAN_FILES[".npz"]: "plan.npz",
        PLAN_FILES[".json"]: "plan.json",
        PROFILE_FILE: "p.npz",
    }
    for purpose, name in checks.items():
        from hybrid_dlrm.common.outputs import _identifies

        for other in ("m.pt", "plan.npz", "plan.json", "p.npz", "junk", "cut.npz"):
            assert _identifies(purpose, tmp_path / other) == (other == name), (purpose, other)


def markdown_table() -> str:
    """TABLE as docs/integrity.md shows it."""
    head = "| flag | " + " | ".join(COLUMNS) + " |"
    rule = "|" + "---|" * (len(COLUMNS) + 1)
    rows = [f"| `{row}` | " + " | ".join(TABLE[row].split()) + " |" for row in TABLE]
    return "\n".join([head, rule, *rows])


def test_the_docs_show_this_table():
    docs = (Path(__file__).resolve().parents[1] / "docs" / "integrity.md").read_text()
    assert markdown_table() in docs, "docs/integrity.md: paste tests/test_output_rule.py's table"

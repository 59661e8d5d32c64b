"""Every page runs in order, as written (scripts/docs_walk.py): README.md, then the pages the
README's Documentation list names, each bash command run in one fresh copy of the checkout with
HYBRID_DLRM_QUICK=1 (hybrid_dlrm/common/quick.py), its exit code the page's, two pages at a time
(a page after those it names in `<!-- walk: after ... -->`); the copy ends clean outside its
ignored folders. The fast tests pin the walk's reading of a page and the variable's
one rule: unset, nothing changes."""

from __future__ import annotations

import importlib.util
import io
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _walk_module():
    spec = importlib.util.spec_from_file_location("docs_walk", ROOT / "scripts" / "docs_walk.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_walk"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


walk = _walk_module()

PAGE = """# A page

Prose may name the convention, `<!-- walk: skip REASON -->`, without skipping anything.

```bash
echo one
```

<!-- walk: skip `make test`: the suite itself -->
```bash
make run     # trains
make test    # tests
```

```bash
# a comment is prose
python -m dlrm.train --num-batches 2 \\
    --out-dir runs/x   # two lines, one command
python -m dlrm.train --num-batches -1   # exits 2
cat > my.toml <<'TOML'
lr = 1
TOML
python -m dlrm.train --data-set kaggle --raw-data-file RAW/train.txt
torchrun --rdzv-endpoint HOST:29500 -m dlrm.train ...
NUMBA_NUM_THREADS=1 python scripts/x.py
```

```python
print("not a shell block")
```

<!-- walk: skip a CUDA GPU -->
```bash
python -m dlrm.train --device cuda
```
"""


def test_a_page_reads_as_its_commands_with_exit_codes_and_skips(tmp_path):
    (tmp_path / "p.md").write_text(PAGE)
    got = [(c.line, c.first_line.split("#")[0].strip(), c.expect, c.skip)
           for c in walk.commands("p.md", tmp_path)]  # fmt: skip
    assert got == [
        (6, "echo one", 0, None),
        (11, "make run", 0, None),
        (12, "make test", 0, "the suite itself"),
        (17, "python -m dlrm.train --num-batches 2 \\", 0, None),
        (19, "python -m dlrm.train --num-batches -1", 2, None),
        (20, "cat > my.toml <<'TOML'", 0, None),
        (23, "python -m dlrm.train --data-set kaggle --raw-data-file RAW/train.txt", 0,
         "template: RAW is a placeholder"),
        (24, "torchrun --rdzv-endpoint HOST:29500 -m dlrm.train ...", 0,
         "template: HOST is a placeholder"),
        (25, "NUMBA_NUM_THREADS=1 python scripts/x.py", 0, None),
        (34, "python -m dlrm.train --device cuda", 0, "a CUDA GPU"),
    ]  # fmt: skip
    heredoc = walk.commands("p.md", tmp_path)[5]
    assert heredoc.text == "cat > my.toml <<'TOML'\nlr = 1\nTOML"


def test_the_page_order_is_the_readmes_list_and_holds_every_page():
    order = walk.page_order()
    assert order[0] == "README.md" and order[1] == "docs/training.md"
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert sorted(pages - set(order)) == []  # a page the README does not list is not walked
    assert len(order) == len(set(order))


def test_the_quick_variable_changes_nothing_unless_set(monkeypatch, capsys):
    from dlrm.train import config_from_args
    from hybrid_dlrm.common import quick

    argv = ["--num-batches", "200", "--hotline-learn-batches", "50", "--out-dir", "runs/q"]
    monkeypatch.delenv(quick.VARIABLE, raising=False)
    cfg = config_from_args(argv)
    assert (cfg.num_batches, cfg.test_data_size, cfg.hotline_learn_batches) == (200, 262_144, 50)
    quick.announce("x")
    assert capsys.readouterr().err == ""
    monkeypatch.setenv(quick.VARIABLE, "0")
    assert config_from_args(argv).num_batches == 200
    monkeypatch.setenv(quick.VARIABLE, "1")
    cfg = config_from_args(argv)
    assert (cfg.num_batches, cfg.test_data_size, cfg.hotline_learn_batches) == (8, 2048, 4)
    assert cfg.mini_batch_size == 512
    quick.announce("python -m dlrm.train")
    assert capsys.readouterr().err == (
        "python -m dlrm.train: HYBRID_DLRM_QUICK is set: --num-batches 200 -> 8, "
        "--mini-batch-size 2048 -> 512, --test-data-size 262144 -> 2048, "
        "--hotline-learn-batches 50 -> 4 "
        "(walk sizes, not a real run)\n"
    )
    assert config_from_args(["--num-batches", "3"]).num_batches == 3  # already small: kept


def test_the_walk_sizes_cut_tables_calibration_and_searches(monkeypatch, capsys):
    from dlrm.train import config_from_args
    from hybrid_dlrm.common import quick
    from perfmodel import calibration
    from perfmodel.report import dcn_configs

    kaggle = "1460-583-10131227-2202608-305-24"
    argv = ["--arch-embedding-size", kaggle, "--synthetic-table-scale", "1.0"]
    quick.announce("an earlier test's cut", io.StringIO())  # said: not this test's
    monkeypatch.delenv(quick.VARIABLE, raising=False)
    monkeypatch.setenv(calibration.ENV, "on")
    cfg = config_from_args(argv)
    assert cfg.arch.embedding_size == (1460, 583, 10131227, 2202608, 305, 24)
    assert (cfg.data.synthetic_table_scale, calibration.budget_s()) == (1.0, 25.0)
    monkeypatch.setenv(quick.VARIABLE, "1")
    cfg = config_from_args(argv)
    assert cfg.arch.embedding_size == (1460, 583, 100_000, 100_000, 305, 24)
    assert cfg.data.synthetic_table_scale == 0.01
    quick.announce("python -m dlrm.train")
    assert capsys.readouterr().err == (
        "python -m dlrm.train: HYBRID_DLRM_QUICK is set: --arch-embedding-size rows -> at "
        "most 100,000, --synthetic-table-scale 1 -> 0.01, --num-batches all -> 8, "
        "--mini-batch-size 2048 -> 512, --test-data-size 262144 -> 2048 "
        "(walk sizes, not a real run)\n"
    )
    assert calibration.budget_s() == 5.0
    monkeypatch.setenv(calibration.ENV, "3")
    assert calibration.budget_s() == 3.0  # a smaller budget given is kept
    assert [n for n, _ in dcn_configs(quick=True)] == [n for n, _ in dcn_configs()][:3]
    assert [n for n, _ in dcn_configs(quick=True)] == [
        "small-b1024-fp32", "small-b1024-fp32-dcn", "small-b1024-fp32-dcn1r32"]  # fmt: skip


def _script(name: str, monkeypatch):
    """scripts/NAME.py as a module, as run by name (scripts/ first on the path: `_shared`)."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# each benchmark a page shows, with the values of its command there (the script's defaults
# where the page gives none): its one `walk_sizes` place reads the variable
BENCH_ARGS = {
    "bench_preprocess": dict(size_gb=1.0, loader_seconds=3.0),
    "bench_sparse_update": dict(reps=30),
    "bench_inference": dict(
        lines_per_day=50_000,
        synthetic_batches=400,
        rounds=5,
        timing_batches=4,
        predict_lines=1_000_000,
        predict_rounds=5,
    ),
    "bench_tbsm_vs_dlrm": dict(users=3000, epochs=1, seeds="1,2,3"),
    "bench_train": dict(
        table_scale=1.0,
        seconds=8.0,
        rounds=7,
        auc_steps=400,
        skip_auc=False,
        batch_sizes="128,2048",
    ),
    "bench_placement": dict(
        table_scale=1.0,
        batch_size=2048,
        train_samples=1 << 19,
        test_samples=1 << 17,
        profile_samples=2_292_031,
        rounds=1,
        interleave_steps=200,
        hotline_learn_batches=32,
    ),
    "bench_slipstream": dict(
        seeds=3,
        hotline_seeds=1,
        batch=2048,
        synthetic_samples=2048 * 2048,
        criteo_lines=7 * 131_072,
        criteo_epochs=3,
        warmup=200,
        interval=50,
        evals_per_epoch=8,
        curve="0.05,0.2",
        interleave_steps=100,
    ),
    "bench_scm": dict(
        file_gb=2.0,
        seconds=3.0,
        dram="512MB",
        hot_budget="256MB",
        ct_hot="16MB",
        ct_cache="16MB",
        serve_cache="64MB",
        tb_dram="3GB",
        train_samples=2048 * 400,
        test_samples=1 << 16,
        profile_samples=2_292_031,
        ct_profile_samples=200_000,
        rounds=5,
        round_steps=40,
        warm_steps=3000,
        cache_steps=5000,
        layout_steps=400,
        serve_requests=300,
        serve_warm=3000,
        tb_steps=2000,
        warmup_steps=40,
        cache_warm_steps=3000,
        layout_warm_steps=100,
        ct_rows=500_000,
    ),
}


def test_the_benchmarks_run_as_asked_unless_the_quick_variable_is_set(monkeypatch, capsys):
    import argparse

    from hybrid_dlrm.common import quick

    monkeypatch.delenv(quick.VARIABLE, raising=False)
    for name, values in BENCH_ARGS.items():
        args = argparse.Namespace(**values)
        _script(name, monkeypatch).walk_sizes(args, name)
        assert {k: getattr(args, k) for k in values} == values, name
    assert capsys.readouterr().err == ""
    args = argparse.Namespace(**BENCH_ARGS["bench_sparse_update"])
    _script("bench_sparse_update", monkeypatch).walk_sizes(args, "x")
    assert args.cases[-1] == (1_000_000, 65_536)  # the cases' sizes as written
    args = argparse.Namespace(**BENCH_ARGS["bench_scm"])
    _script("bench_scm", monkeypatch).walk_sizes(args, "x")
    assert (len(args.tables), sum(args.tables), args.batch, args.tb_rows) == (
        26,
        33_762_577,
        2048,
        10_000_000,
    )


def test_a_benchmark_under_the_quick_variable_runs_at_walk_sizes_and_says_so(monkeypatch, capsys):
    import argparse

    from hybrid_dlrm.common import quick

    quick.announce("an earlier test's cut", io.StringIO())  # said: not this test's
    monkeypatch.setenv(quick.VARIABLE, "1")
    bench_train = _script("bench_train", monkeypatch)
    args = argparse.Namespace(**BENCH_ARGS["bench_train"])  # speed.md: --seconds 8 --rounds 7
    bench_train.walk_sizes(args, "bench_train.py")
    assert (args.table_scale, args.seconds, args.rounds, args.batch_sizes) == (
        0.01, 0.02, 1, "128,512")  # fmt: skip
    assert (args.auc_steps, args.auc_batch, args.auc_test_size) == (8, 512, 2048)
    # fewer than 1,000 steps of data: `--compile` auto leaves bf16 eager, no 20-70 s compile
    assert (args.data_steps, args.generator_samples) == (64, 20_000)
    assert capsys.readouterr().err == (
        "bench_train.py: HYBRID_DLRM_QUICK is set: --table-scale 1 -> 0.01, --seconds 8 -> 0.02, "
        "--rounds 7 -> 1, --batch-sizes 2048 -> 512, --auc-steps 400 -> 8, the AUC check's batch "
        "2048 -> 512, its test samples 262144 -> 2048, steps of data per variant 1000000 -> 64, "
        "generator samples 1000000 -> 20000 (walk sizes, not a real run)\n"
    )
    args = argparse.Namespace(**BENCH_ARGS["bench_sparse_update"])
    _script("bench_sparse_update", monkeypatch).walk_sizes(args, "bench_sparse_update.py")
    assert args.reps == 1 and args.cases[-1] == (100_000, 65_536)
    assert "the cases' table rows -> at most 100,000" in capsys.readouterr().err
    args = argparse.Namespace(**BENCH_ARGS["bench_inference"])
    _script("bench_inference", monkeypatch).walk_sizes(args, "bench_inference.py")
    assert vars(args) == dict(lines_per_day=4000, synthetic_batches=8, rounds=1, timing_batches=1,
                              predict_lines=4000, predict_rounds=1)  # fmt: skip
    assert capsys.readouterr().err.startswith("bench_inference.py: HYBRID_DLRM_QUICK is set: "
                                              "--lines-per-day 50000 -> 4000")  # fmt: skip


def test_hash_mode_tables_are_cut_to_the_walks_rows(tmp_path, monkeypatch, capsys):
    """Terabyte's 10M rows a table (62 GiB at dim 64) would not fit the walk's machine: the
    training and the preprocessing CLIs cut --max-ind-range, given or the recipe's."""
    import json

    from data_pipeline.__main__ import main as data_pipeline
    from dlrm.train import config_from_args
    from hybrid_dlrm.common import quick

    quick.announce("an earlier test's cut", io.StringIO())
    tb, kaggle = (["--data-set", d, "--raw-data-file", "raw/x"] for d in ("terabyte", "kaggle"))
    monkeypatch.delenv(quick.VARIABLE, raising=False)
    assert config_from_args(tb).data.max_ind_range == 10_000_000
    monkeypatch.setenv(quick.VARIABLE, "1")
    assert config_from_args(tb).data.max_ind_range == 20_000
    assert config_from_args([*tb, "--max-ind-range", "5000"]).data.max_ind_range == 5000
    assert (config_from_args(kaggle).data.max_ind_range or 0) <= 0  # frequency mode: no rows cap
    quick.announce("x", io.StringIO())
    monkeypatch.chdir(tmp_path)
    assert data_pipeline(["synth", "--layout", "terabyte", "--out", "raw", "--lines", "50"]) == 0
    assert (
        data_pipeline(["preprocess", "--dataset", "terabyte", "--raw", "raw", "--out", "tb"]) == 0
    )
    meta = json.loads((tmp_path / "tb" / "meta.json").read_text())
    assert meta["table_sizes"] == [20_000] * 26
    assert "--max-ind-range 10000000 -> 20000" in capsys.readouterr().err


def test_a_page_runs_after_the_pages_it_names_and_two_run_at_once(tmp_path):
    (tmp_path / "p.md").write_text("# P\n\n<!-- walk: after README.md, docs/a.md: its files -->\n")
    assert walk.needs("p.md", tmp_path) == ["README.md", "docs/a.md"]
    pages = ["README.md", "docs/a.md", "docs/b.md", "docs/c.md", "docs/d.md"]
    after = {"docs/c.md": ["README.md", "docs/a.md"], "docs/d.md": ["docs/c.md"]}
    events, lock = [], threading.Lock()
    gates = {p: threading.Event() for p in pages}

    def walk_page(page):
        with lock:
            events.append(("start", page))
        assert gates[page].wait(10)
        with lock:
            events.append(("end", page))

    runner = threading.Thread(target=walk.schedule, args=(pages, after, 2, walk_page))
    runner.start()
    # README.md and docs/a.md at once (both started before either may end: a loaded machine
    # can start the second thread after the first has ended); docs/c.md waits for both,
    # docs/d.md for docs/c.md
    _wait_for(events, lock, ("start", "README.md"))
    _wait_for(events, lock, ("start", "docs/a.md"))
    for page in pages:
        _wait_for(events, lock, ("start", page))
        gates[page].set()
    runner.join(10)
    assert sorted(p for e, p in events if e == "start") == sorted(pages)  # each once
    assert set(events[:2]) == {("start", "README.md"), ("start", "docs/a.md")}  # two at once
    for page, names in after.items():
        for name in names:
            assert events.index(("end", name)) < events.index(("start", page))
    serial = []
    walk.schedule(pages, after, 1, serial.append)
    assert serial == pages
    with pytest.raises(ValueError, match=r"docs/c.md: <!-- walk: after docs/z.md -->"):
        walk.schedule(pages, {"docs/c.md": ["docs/z.md"]}, 2, serial.append)


def _wait_for(events, lock, event, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with lock:
            if event in events:
                return
        time.sleep(0.01)
    raise AssertionError(f"{event} did not happen: {events}")


# about 80 fresh processes that each import torch, two pages at a time: part of `make test`
# (slow: it starts processes), alone `make test-docs`
@pytest.mark.walk
@pytest.mark.usefixtures("starts_processes")
def test_every_page_runs_in_order_as_written(tmp_path):
    before = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True,
                            text=True).stdout  # fmt: skip
    result = walk.walk(walk.page_order(), tmp_path, quick=True, timeout=600, jobs=2)
    failed = [
        f"{c['page']}:{c['line']}: {c['text'].splitlines()[0]}\n    exit {c['rc']} "
        f"(the page shows {c['expect']})\n    " + "\n    ".join(c["tail"])
        for c in result["commands"]
        if c["status"] == "failed"
    ]
    assert not failed, "\n".join(failed)
    assert result["left_in_checkout"] == [], "outside the ignored folders"
    after = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True,
                           text=True).stdout  # fmt: skip
    assert after == before  # the walk ran in its copy: the checkout is as it was
    assert result["counts"]["ok"] > result["counts"]["skipped"], result["counts"]
    launched = ("torchrun", "python -m dlrm.torchrun")
    ran = [c for c in result["commands"] if c["text"].startswith(launched) and c["rc"] == 0]
    assert ran, "no torchrun command ran"
    for c in ran:  # each message once per run, not once per rank
        assert said_twice(c["output"]) == [], f"{c['page']}:{c['line']}"


def said_twice(output: str) -> list[str]:
    """The lines of a run's (timed) output said more than once, but torchrun's own warnings and
    the lines that name their rank."""
    lines = [re.sub(r"^\[\s*[\d.]+s\] ", "", x) for x in output.splitlines()]
    lines = [x for x in lines if x.strip() and not re.match(r"[WI]\d{4} ", x)]
    return sorted({x for x in lines if lines.count(x) > 1 and not re.search(r"\brank \d", x)})


def test_said_twice_finds_a_line_of_each_rank():
    out = "[  1.0s] threads 1\n[  1.1s] threads 1\n[  2.0s] rank 1: stopped\n[ 2.1s] x\n"
    out += "W1128 05:09:59.878 run.py:874] ***\nW1128 05:09:59.878 run.py:874] ***\n"
    assert said_twice(out) == ["threads 1"]

"""The README's command sequences run as written (at tiny sizes, in-process): the placement
examples show what their comments claim, and the quantize -> predict sequence starts from data a
user can make and ends in a submission file."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
TINY = ["--num-batches", "2", "--data-size", "4096", "--test-data-size", "1024",
        "--mini-batch-size", "512", "--progress=false", "--print-freq", "0"]  # fmt: skip


def _commands(marker: str) -> list[tuple[list[str], str]]:
    """(argv after `python -m`, the comment) of every line of the README's bash block holding
    `marker`."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), re.S)
    block = next(b for b in blocks if marker in b)
    out = []
    for line in block.splitlines():
        code, _, comment = line.partition(" #")
        if code.startswith("python -m "):
            out.append((shlex.split(code)[2:], comment.strip()))
    return out


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_placement_examples_do_what_their_comments_say(tmp_path, monkeypatch, capsys):
    from dlrm.train import main

    monkeypatch.chdir(tmp_path)
    ran = 0
    for i, (argv, comment) in enumerate(_commands("--placement auto")):
        if argv[0] != "dlrm.train" or "--hot-budget" not in argv:
            continue  # the budget's examples: what the tables' size makes them show
        argv = [a.replace("/ssd/", f"{tmp_path}/ssd/") for a in argv[1:]]
        assert main([*argv, *TINY, "--out-dir", f"run{i}"]) == 0, (argv, capsys.readouterr().err)
        placement = json.loads((tmp_path / f"run{i}" / "summary.json").read_text())["placement"]
        kind = argv[argv.index("--placement") + 1]
        if kind == "auto":  # "...: device" or "...: fastest of host, fae, ..." (predicted here)
            said = comment.rsplit(": ", 1)[1].removeprefix("fastest of ").split(", ")
            assert placement["kind"] in said, (argv, placement["kind"], said)
        if placement["kind"] != "device":  # a budget below the tables: rows stay off the device
            assert placement["device_tier_bytes"] < placement["embedding_bytes"], argv
        ran += 1
    assert ran == 5


@pytest.mark.usefixtures("starts_processes")
def test_the_quantize_predict_sequence_runs_as_pasted(tmp_path, monkeypatch, capsys):
    from data_pipeline.__main__ import main as data_pipeline
    from dlrm.train import main as train
    from hybrid_dlrm.serving.predict import main as predict
    from hybrid_dlrm.serving.quantize import main as quantize

    monkeypatch.chdir(tmp_path)
    entry = {"data_pipeline": data_pipeline, "dlrm.train": train, "hybrid_dlrm.serving.quantize": quantize,
             "hybrid_dlrm.serving.predict": predict}  # fmt: skip
    # the Kaggle files the Criteo example makes in raw/, then the inference block
    commands = _commands("data_pipeline synth --layout kaggle")[:1] + _commands(
        "hybrid_dlrm.serving.predict"
    )
    assert [a[0] for a, _ in commands] == ["data_pipeline", "dlrm.train", "hybrid_dlrm.serving.quantize",
                                           "hybrid_dlrm.serving.predict", "hybrid_dlrm.serving.predict"]  # fmt: skip
    assert commands[0][0][-4:] == ["--lines", "100000", "--test-lines", "10000"]
    assert "raw/train.txt" in commands[1][0] and "raw/test.txt" in commands[3][0]
    for argv, _ in commands:
        module, args = argv[0], argv[1:]
        if module == "data_pipeline":  # the sample at a tiny size
            args[args.index("--lines") + 1], args[args.index("--test-lines") + 1] = "3000", "300"
        if module == "dlrm.train":
            args += ["--num-batches", "8", "--progress=false", "--print-freq", "0"]
        assert entry[module](args) == 0, (argv, capsys.readouterr().err)
    said = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    tier = [s["ssd_tier"] for s in said if "ssd_tier" in s]  # the --scm-dir run says so
    assert len(tier) == 1 and tier[0]["dir"].endswith("ssd/s") and tier[0]["rows_read"] > 0
    for name in ("submission.csv", "s.csv"):
        lines = (tmp_path / name).read_text().splitlines()
        assert lines[0] == "Id,Predicted" and len(lines) == 301
    assert (tmp_path / "submission.csv").read_text() == (tmp_path / "s.csv").read_text()


@pytest.mark.usefixtures("starts_processes")
def test_the_inference_page_block_runs_as_pasted(tmp_path, monkeypatch, capsys):
    """docs/inference.md's "Run it" block, in order (tiny sizes): raw lines -> run -> every
    export -> both checks -> both predictions -> the reference's --inference-only."""
    from data_pipeline.__main__ import main as data_pipeline
    from dlrm.train import main as train
    from hybrid_dlrm.serving.predict import main as predict
    from hybrid_dlrm.serving.quantize import main as quantize

    page = (README.parent / "docs" / "inference.md").read_text()
    block = next(
        b
        for b in re.findall(r"```bash\n(.*?)```", page, re.S)
        if "hybrid_dlrm.serving.quantize" in b
    )
    block = re.sub(r"\\\n\s*", "", block)  # continuation lines
    entry = {"data_pipeline": data_pipeline, "dlrm.train": train, "hybrid_dlrm.serving.quantize": quantize,
             "hybrid_dlrm.serving.predict": predict}  # fmt: skip
    monkeypatch.chdir(tmp_path)
    ran = []
    for line in block.splitlines():
        code = re.sub(r"\[[^\]]*\]", "", line.partition(" #")[0])  # optional parts left out
        if not code.startswith("python -m "):
            continue  # the benchmark script
        module, *args = shlex.split(code)[2:]
        if module == "data_pipeline":
            args[args.index("--lines") + 1], args[args.index("--test-lines") + 1] = "3000", "300"
        if module == "dlrm.train":
            args += ["--num-batches", "8", "--test-mini-batch-size", "512", "--progress=false"]
        assert entry[module](args) == 0, (module, args, capsys.readouterr().err)
        ran.append(module)
    assert (
        ran.count("hybrid_dlrm.serving.quantize") == 6
        and ran.count("hybrid_dlrm.serving.predict") == 2
    ), ran
    lines = (tmp_path / "submission-int8.csv").read_text().splitlines()
    assert lines[0] == "Id,Predicted" and len(lines) == 301
    assert (tmp_path / "preds.csv").is_file()

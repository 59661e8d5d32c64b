"""Quantizing a `--placement tiered` run from its run directory: the rows come from its SSD tier,
rolled back to the checkpoint as `--resume` does, and the artifact is the one the same model
trained with `--placement device` gives; the run's files are not touched."""

import hashlib
import shutil
import subprocess
import sys

import pytest
import torch

from dlrm import TrainConfig, Trainer
from hybrid_dlrm.serving import Predictor
from hybrid_dlrm.serving.inference_data import data_source, load_source, take_batches
from hybrid_dlrm.serving.quantize import main

TINY = dict(
    arch_embedding_size=(60, 40, 500, 7), arch_sparse_feature_size=4, arch_mlp_bot=(13, 16, 4),
    arch_mlp_top=(16, 1), mini_batch_size=64, data_size=64 * 30, test_data_size=512,
    learning_rate=0.1, progress=False, device="cpu",
)  # fmt: skip
TIERED = dict(placement="tiered", hot_budget="2KB", scm_cache="2KB", scm_io="buffered")
DEVICE = dict(placement="device", embedding_init="hashed")  # the tiered placement's init
TIER_FILES = ("rows.dat", "journal.log", "tier.json")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, long_training):  # two tiny runs
    d = tmp_path_factory.mktemp("qtiered")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny batches: threads cost more than they save
    try:
        for name, flags in (("tiered", TIERED), ("device", DEVICE)):
            Trainer(TrainConfig(**TINY, **flags, out_dir=str(d / name))).fit()
    finally:
        torch.set_num_threads(threads)
    return d


def digests(folder):
    return {n: hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in TIER_FILES}


def test_a_tiered_run_quantizes_to_the_device_runs_artifact(runs):
    before = digests(runs / "tiered" / "scm")
    for name in ("tiered", "device"):
        assert main([str(runs / name), "--out", str(runs / f"{name}.int8"),
                     "--emb-precision", "int8"]) == 0  # fmt: skip
    assert digests(runs / "tiered" / "scm") == before  # the run's tier is only read
    a, b = runs / "tiered.int8" / "tables", runs / "device.int8" / "tables"
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir()) and len(names) == 4
    assert all((a / n).read_bytes() == (b / n).read_bytes() for n in names)
    source = load_source(runs / "device")
    batches = take_batches(data_source(source, None, "test", 256), 0).batches()
    pa, pb = Predictor.load(runs / "tiered.int8"), Predictor.load(runs / "device.int8")
    for batch in batches:
        assert torch.equal(pa.predict(batch), pb.predict(batch))


def test_a_tier_without_its_rows_is_one_line_naming_the_file(runs, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(runs / "tiered", copy, ignore=shutil.ignore_patterns(".lock"))
    (copy / "scm" / "rows.dat").unlink()
    assert main([str(copy), "--out", str(tmp_path / "a"), "--emb-precision", "int8"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(copy / "scm" / "rows.dat") in err and "missing" in err
    assert not (tmp_path / "a").exists()


def test_a_damaged_block_of_the_tier_is_one_line_naming_the_runs_file(runs, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(runs / "tiered", copy, ignore=shutil.ignore_patterns(".lock"))
    rows = copy / "scm" / "rows.dat"
    raw = bytearray(rows.read_bytes())
    raw[100] ^= 0xFF  # in block 0, which the tier holds written rows of
    rows.write_bytes(bytes(raw))
    assert main([str(copy), "--out", str(tmp_path / "a"), "--emb-precision", "int8"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{rows}: block 0" in err and "damaged" in err


def test_a_run_in_use_is_refused_in_one_line(runs, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(runs / "tiered", copy, ignore=shutil.ignore_patterns(".lock"))
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from hybrid_dlrm.common.lock import DirectoryLock; "
         "DirectoryLock(sys.argv[1]).acquire('x'); print('held', flush=True); time.sleep(60)",
         str(copy / "scm")],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main([str(copy), "--out", str(tmp_path / "a"), "--emb-precision", "int8"]) == 2
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "in use by another process" in err
    assert not (tmp_path / "a").exists()

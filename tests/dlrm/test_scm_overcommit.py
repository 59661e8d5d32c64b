"""--scm-overcommit: the disk check counts the blocks a run's lookups can write at most, not the
SSD tier's whole sparse file; without it the refusal is the one it always was; a disk that fills
while an over-committed tier trains stops the run in one line, and the last checkpoint resumes to
the uninterrupted run's end."""

from __future__ import annotations

import logging

import pytest

from dlrm import Trainer
from dlrm.config import TrainConfig
from dlrm.errors import ConfigError
from dlrm.placement.tiered_setup import tiered_needs
from dlrm.train import config_from_args
from embeddings.config import SparseOptimizer, TableSpec
from embeddings.errors import ScmError
from embeddings.hot_rows import row_bytes
from embeddings.room import fmt_bytes
from embeddings.ssd.file import BLOCK, PAYLOAD
from tests.dlrm.test_tiered_training import (
    RESUMABLE,
    eval_history,
    fill_after_first_checkpoint,
    same_tables,
)

BIG = (1_000_000, 1_000_000, 500, 7)  # 64.5 MB of tier file at dim 4 with Adagrad


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _tables(sizes, dim=4):
    return [TableSpec(f"t_cat_{i}", n, dim, f"cat_{i}") for i, n in enumerate(sizes)]


def _file_blocks(sizes, rb):
    return -(-sum(sizes) // (PAYLOAD // rb))


def test_the_check_counts_what_the_steps_can_write():
    sizes = (1_000_000, 300, 2_000_000)
    opt = SparseOptimizer("adagrad")
    rb = row_bytes(4, opt)
    per_block = PAYLOAD // rb
    args = ["--arch-embedding-size", "-".join(map(str, sizes)), "--arch-sparse-feature-size",
            "4", "--arch-mlp-bot", "13-8-4", "--arch-mlp-top", "8-1", "--mini-batch-size", "32",
            "--num-batches", "10", "--nepochs", "2", "--multi-hot-sizes", "3-2-5",
            "--optimizer", "adagrad", "--placement", "tiered"]  # fmt: skip
    plain = tiered_needs(config_from_args(args), _tables(sizes), opt, 0)
    over = tiered_needs(config_from_args([*args, "--scm-overcommit"]), _tables(sizes), opt, 0)
    assert _tier_file(plain) == _file_blocks(sizes, rb) * BLOCK  # the whole file, as before
    # 20 steps x 32 samples x the bag: table 1 is capped at its own blocks (+1: a shared edge)
    bound = 20 * 32 * 3 + (-(-300 // per_block) + 1) + 20 * 32 * 5
    assert _tier_file(over) == bound * BLOCK
    # beside it the write-back log's ring, whole (its size is the log's, not the steps')
    assert over.on("disk") - _tier_file(over) == plain.on("disk") - _tier_file(plain)
    assert "over-committed" in over.of("disk")[0].what
    assert "over-committed" not in plain.of("disk")[0].what


def test_without_known_steps_the_whole_file_is_counted():
    # a whole epoch of a data set on disk: how many steps is not known before it is read
    cfg = config_from_args(["--data-set", "kaggle", "--processed-data-file", "d",
                            "--placement", "tiered", "--scm-overcommit"])  # fmt: skip
    opt = SparseOptimizer("sgd")
    sizes = (5_000_000, 7)
    needs = tiered_needs(cfg, _tables(sizes, 16), opt, 0)
    assert _tier_file(needs) == _file_blocks(sizes, row_bytes(16, opt)) * BLOCK


def _tier_file(needs) -> int:
    return sum(n.bytes for n in needs.of("disk") if n.what.startswith("SSD tier file"))


def _cfg(tmp_path, disk, **kw) -> TrainConfig:
    from tests.dlrm.conftest import tiny

    return tiny(tmp_path, **dict(RESUMABLE, arch_embedding_size=BIG, scm_dir=str(disk / "scm"),
                                 **kw))  # fmt: skip


def test_a_disk_smaller_than_the_file_refuses_without_the_flag_and_trains_with_it(
    tmp_path, tmpfs, monkeypatch, caplog
):
    disk = tmpfs("size=16m")
    rb = row_bytes(4, SparseOptimizer("adagrad"))
    whole = fmt_bytes(_file_blocks(BIG, rb) * BLOCK)
    with pytest.raises(ConfigError) as e:
        Trainer(_cfg(tmp_path, disk, out_dir=str(tmp_path / "refused")))
    line = str(e.value)
    assert "\n" not in line and line.startswith("--placement tiered: needs ")
    assert f"SSD tier file (--scm-dir, rows of 4 + state floats) {whole}" in line, line
    assert f"of disk under {disk / 'scm'}" in line and "over-committed" not in line, line
    # the placements that fit, and the room the chosen tier would need to stay
    assert line.endswith(", or use more free space under --scm-dir"), line

    # over-committed: the check passes, the start says so; the disk fills after the first
    # checkpoint: one line naming the file system, and the checkpoint resumes to the end
    fill_after_first_checkpoint(monkeypatch, disk)
    run = str(tmp_path / "run")
    with caplog.at_level(logging.INFO, logger="dlrm.placement.tiered_setup"):
        with pytest.raises(ScmError) as e:
            Trainer(_cfg(tmp_path, disk, scm_overcommit=True, out_dir=run)).fit()
    said = [r.getMessage() for r in caplog.records if "over-committed" in r.getMessage()]
    assert len(said) == 1 and f"{whole} sparse" in said[0], said
    msg = str(e.value)
    assert "\n" not in msg and f"no space left on the file system mounted at {disk}" in msg, msg
    monkeypatch.undo()
    (disk / "filler").unlink()
    resumed = Trainer(_cfg(tmp_path, disk, scm_overcommit=True, out_dir=run, resume="auto"))
    summary = resumed.fit()

    plain = tmp_path / "plain-disk"
    plain.mkdir()
    full = Trainer(_cfg(tmp_path, plain, scm_overcommit=True, out_dir=str(tmp_path / "full")))
    full_summary = full.fit()
    same_tables(full, resumed)
    assert all(full_summary[k] == summary[k] for k in ["test_auc", "test_logloss", "steps"])
    assert eval_history(tmp_path / "run") == eval_history(tmp_path / "full")

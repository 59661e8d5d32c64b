"""A predictor opened with --scm-dir: the artifact's quantized tables served from the SSD tier
through a row cache smaller than them, scoring exactly as the in-memory predictor."""

import json

import pytest
import torch

from dlrm import Trainer
from embeddings.errors import ScmError
from embeddings.ssd.file import BLOCK
from embeddings.ssd.serving import MANIFEST, ROWS
from hybrid_dlrm.serving import Predictor
from hybrid_dlrm.serving.artifact import ArtifactError
from hybrid_dlrm.serving.predict import main as predict
from hybrid_dlrm.serving.quantize import main as quantize


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    from tests.dlrm.conftest import tiny

    d = tmp_path_factory.mktemp("serve")
    trainer = Trainer(tiny(d, arch_sparse_feature_size=8, arch_mlp_bot=(13, 16, 8),
                           data_size=64 * 8, test_data_size=512))  # fmt: skip
    trainer.fit()
    art = d / "art"
    mixed = "cat_0=int4,cat_1=fp32,cat_3=fp16"  # rows of 8, 32, 12 (int8) and 16 bytes
    assert quantize([str(trainer.run_dir), "--out", str(art), "--emb-precision-table", mixed]) == 0
    batches = list(trainer.data.test.batches(0))
    return art, batches


def test_the_tier_scores_as_the_in_memory_predictor_through_a_small_cache(artifact, tmp_path):
    art, batches = artifact
    memory = Predictor.load(art, backend="torch")
    fbgemm = Predictor.load(art)
    tiered = Predictor.load(art, scm_dir=tmp_path / "scm", scm_cache=40 * 32)  # 40 rows
    for b in batches:
        p = tiered.predict(b)
        assert torch.equal(p, memory.predict(b))  # the same arithmetic on the same bytes
        assert torch.allclose(p, fbgemm.predict(b), rtol=0, atol=1e-6)
    c = tiered.model.embeddings.counters()
    assert c["scm_cache_hits"] > 0 and c["scm_rows_read"] > 40  # rows evicted and read again
    assert c["scm_copied_blocks"] > 0
    for x, y in zip(
        tiered.model.embeddings.table_weights(), memory.model.embeddings.table_weights()
    ):
        assert torch.equal(x, y)
    # raw lines are scored by predict_rows (one id per feature, no KeyedJaggedTensor)
    b = batches[0]
    kjt = b.sparse_features
    assert bool((kjt.lengths() == 1).all())  # Kaggle-shaped: one id per feature
    ids = kjt.values().view(len(kjt.keys()), -1).t()
    rows = tiered.predict_rows(b.dense_features, ids)
    assert torch.equal(rows, memory.predict_rows(b.dense_features, ids))
    assert torch.allclose(rows, memory.predict(b), rtol=0, atol=1e-6)
    again = Predictor.load(art, scm_dir=tmp_path / "scm", scm_cache=0)  # no cache at all
    assert again.model.embeddings.counters()["scm_copied_blocks"] == 0  # the tier was reused
    assert torch.equal(again.predict(batches[0]), memory.predict(batches[0]))


def test_a_damaged_tier_block_is_named_and_an_unfinished_copy_is_redone(artifact, tmp_path):
    art, batches = artifact
    scm = tmp_path / "scm"
    Predictor.load(art, scm_dir=scm, scm_io="buffered")
    with open(scm / ROWS, "r+b") as f:
        f.seek(2 * BLOCK + 5)
        f.write(b"\xee")
    p = Predictor.load(art, scm_dir=scm, scm_cache=0, scm_io="buffered")
    with pytest.raises(ScmError, match=rf"rows.dat: block 2 at offset {2 * BLOCK}: checksum"):
        for b in batches:
            p.predict(b)
    (scm / MANIFEST).unlink()  # as a copy interrupted before its end leaves it
    p = Predictor.load(art, scm_dir=scm, scm_io="buffered")
    assert p.model.embeddings.counters()["scm_copied_blocks"] > 2
    assert torch.equal(
        p.predict(batches[0]), Predictor.load(art, backend="torch").predict(batches[0])
    )
    manifest = json.loads((scm / MANIFEST).read_text())
    assert manifest["layout"]["row_bytes"] == [8, 32, 12, 16]


def test_predict_cli_scores_from_the_tier(artifact, tmp_path, capsys):
    art, _ = artifact
    data = artifact[0].parent / "run"  # not a data set: the flags are checked first
    assert predict(["--model", str(art), "--data", str(data), "--out", str(tmp_path / "p.csv"),
                    "--scm-dir", str(tmp_path / "scm"), "--scm-cache", "lots"]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--scm-cache: expected a size like 256MB" in err[0]
    with pytest.raises(ArtifactError, match="--scm-io: expected one of direct, buffered"):
        Predictor.load(art, scm_dir=tmp_path / "scm2", scm_io="mmap")

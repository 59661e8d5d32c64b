"""Issue 37's serving cases, as a hostile user would try them: what an artifact's results depend
on is checksummed, every id is checked against its table, `--out` never destroys what is there,
a tier directory of another owner is never written, and each mistake is one line (exit 2)."""

import json
import os
import shutil
import stat

import pytest
import torch

from data_pipeline.synthetic_raw import SyntheticSpec, write_kaggle
from dlrm.train import main as train
from hybrid_dlrm.common.manifest import seal
from hybrid_dlrm.serving import Predictor
from hybrid_dlrm.serving.artifact import ArtifactError
from hybrid_dlrm.serving.predict import main as predict
from hybrid_dlrm.serving.quantize import main as quantize

ARCH = ["--arch-sparse-feature-size", "4", "--arch-mlp-bot", "13-8-4", "--arch-mlp-top", "8-1",
        "--mini-batch-size", "128", "--learning-rate", "0.1"]  # fmt: skip


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("refusals")
    write_kaggle(d / "raw", 7 * 100, 30, SyntheticSpec(vocab_cap=200))
    assert train(["--data-set", "kaggle", "--raw-data-file", str(d / "raw" / "train.txt"),
                  "--processed-data-file", str(d / "proc"), "--max-ind-range", "97", *ARCH,
                  "--out-dir", str(d / "run")]) == 0  # fmt: skip
    assert quantize([str(d / "run"), "--out", str(d / "art"), "--batch-size", "256"]) == 0
    return d


def _art(world, tmp_path):
    return shutil.copytree(world / "art", tmp_path / "art")


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def _run(world, tmp_path, *args, art=None):
    return predict(["--model", str(art or world / "art"),
                    "--data", str(world / "raw" / "test.txt"), *args])  # fmt: skip


def _reseal(art, edit):
    """The manifest changed by `edit`, sealed again: only the structural checks can tell."""
    from hybrid_dlrm.serving.artifact import read_manifest

    m = read_manifest(art)
    head = {k: m.pop(k) for k in ("format", "format_version")}
    edit(m)
    (art / "manifest.json").write_text(json.dumps({**head, **seal(m)}))


# --- 5. the manifest is covered by a checksum ----------------------------------------------------


def test_an_edited_manifest_value_is_refused_not_served(world, tmp_path, capsys):
    art = _art(world, tmp_path)
    text = (art / "manifest.json").read_text()
    assert '"max_ind_range": 97' in text
    (art / "manifest.json").write_text(text.replace('"max_ind_range": 97', '"max_ind_range": 50'))
    with pytest.raises(ArtifactError, match=r"manifest.json: .*checksum"):
        Predictor.load(art)
    assert _run(world, tmp_path, "--out", str(tmp_path / "p.csv"), art=art) == 2
    assert "manifest.json" in _one_line(capsys)
    assert not (tmp_path / "p.csv").exists()


def test_an_unsealed_manifest_of_the_first_format_is_refused_with_re_export(world, tmp_path):
    from hybrid_dlrm.serving.artifact import read_manifest

    art = _art(world, tmp_path)
    old = {**read_manifest(art), "format_version": 1}
    (art / "manifest.json").write_text(json.dumps(old))
    with pytest.raises(ArtifactError, match=r"manifest.json: .*version 1.*re-export"):
        Predictor.load(art)


# --- 13. a structurally wrong manifest -----------------------------------------------------------


@pytest.mark.parametrize(
    "edit, says",
    [
        (lambda m: m["tables"].pop(), "tables"),
        (lambda m: m.update(files=list(m["files"])), "files"),
        (lambda m: m["tables"][0].pop("precision"), "precision"),
        (lambda m: m["tables"][1].update(rows="many"), "rows"),
        (lambda m: m["dense"].update(files=None), "dense"),
    ],
)
def test_a_structurally_wrong_manifest_is_one_line(world, tmp_path, edit, says):
    art = _art(world, tmp_path)
    _reseal(art, edit)
    with pytest.raises(ArtifactError, match=rf"^{art / 'manifest.json'}: .*{says}") as e:
        Predictor.load(art)
    assert "\n" not in str(e.value)


# --- 7 and 19. ids, columns and arguments of the library -----------------------------------------


def test_every_id_is_checked_against_its_table(world):
    p = Predictor.load(world / "art")
    dense = torch.zeros(4, 13)
    ids = torch.zeros(4, 26, dtype=torch.int64)
    assert p.predict_rows(dense, ids).shape == (4,)
    bad = ids.clone()
    bad[2, 5] = -1
    with pytest.raises(
        ValueError, match=r"row 2: id -1 of feature cat_5 is outside table t_cat_5 \(97 rows\)"
    ):
        p.predict_rows(dense, bad)
    bad[2, 5] = 0
    bad[3, 25] = 97
    with pytest.raises(
        ValueError, match=r"row 3: id 97 of feature cat_25 is outside table t_cat_25"
    ):
        p.predict_rows(dense, bad)


def test_wrong_column_counts_and_backend_are_named(world):
    p = Predictor.load(world / "art")
    with pytest.raises(ValueError, match=r"ids: expected 26 columns \(one per table\), found 25"):
        p.predict_rows(torch.zeros(4, 13), torch.zeros(4, 25, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"dense: expected 13 columns, found 12"):
        p.predict_rows(torch.zeros(4, 12), torch.zeros(4, 26, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"4 rows of ids, 3 of dense"):
        p.predict_rows(torch.zeros(3, 13), torch.zeros(4, 26, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"^backend: expected auto, fbgemm or torch, got 'xyz'$"):
        Predictor.load(world / "art", backend="xyz")


# --- 8. --out never destroys what is there -------------------------------------------------------


@pytest.mark.usefixtures("starts_processes")
def test_an_existing_out_is_refused_unless_overwrite(world, tmp_path, capsys):
    out = tmp_path / "p.csv"
    out.write_text("an earlier result\n")
    assert _run(world, tmp_path, "--out", str(out)) == 2
    assert "--out" in _one_line(capsys) and out.read_text() == "an earlier result\n"
    assert _run(world, tmp_path, "--out", str(out), "--overwrite") == 0
    assert out.read_text().startswith("Id,Predicted\n")


@pytest.mark.parametrize("target", ["data", "manifest", "table", "artifact_dir_file"])
def test_out_never_replaces_the_input_or_the_artifact(world, tmp_path, capsys, target):
    art = _art(world, tmp_path)
    data = tmp_path / "test.txt"
    shutil.copy(world / "raw" / "test.txt", data)
    path = {"data": data, "manifest": art / "manifest.json", "table": art / "tables/t_cat_0.npy",
            "artifact_dir_file": art / "new.csv"}[target]  # fmt: skip
    before = {p: p.read_bytes() for p in [data, *art.rglob("*")] if p.is_file()}
    for extra in ([], ["--overwrite"]):
        rc = predict(["--model", str(art), "--data", str(data), "--out", str(path), *extra])
        assert rc == 2
        _one_line(capsys)
    assert {p: p.read_bytes() for p in [data, *art.rglob("*")] if p.is_file()} == before
    # a hard link to the input is the input
    os.link(data, tmp_path / "link.csv")
    assert predict(["--model", str(art), "--data", str(data), "--out",
                    str(tmp_path / "link.csv"), "--overwrite"]) == 2  # fmt: skip
    assert data.read_bytes() == before[data]


def test_out_that_is_not_a_regular_file_is_refused(world, tmp_path, capsys):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    target = tmp_path / "target.csv"
    target.write_text("kept\n")
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    for path in (fifo, link, "/dev/null"):
        for extra in ([], ["--overwrite"]):
            assert _run(world, tmp_path, "--out", str(path), *extra) == 2
            _one_line(capsys)
    assert stat.S_ISFIFO(fifo.lstat().st_mode) and link.is_symlink()
    assert target.read_text() == "kept\n"
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)


@pytest.mark.usefixtures("starts_processes")
def test_out_dash_writes_to_stdout(world, tmp_path, capsys):
    assert _run(world, tmp_path, "--out", "-") == 0
    cap = capsys.readouterr()
    lines = cap.out.splitlines()
    assert lines[0] == "Id,Predicted" and len(lines) == 31
    assert json.loads(cap.err.strip().splitlines()[-1])["rows"] == 30


# --- 15. a full disk -----------------------------------------------------------------------------


@pytest.mark.parametrize("copies", [20, 1])  # 1: the CSV fits the write buffer: the commit fails
def test_a_full_disk_is_one_line_and_leaves_no_temporary(world, tmp_path, tmpfs, capsys, copies):
    full = tmpfs("size=4k")
    (full / "pad").write_bytes(b"x" * 4000)  # its one page: nothing left
    big = tmp_path / "big.txt"
    big.write_bytes((world / "raw" / "test.txt").read_bytes() * copies)
    rc = predict(["--model", str(world / "art"), "--data", str(big), "--out", str(full / "p.csv")])
    assert rc == 2
    assert f"no space left on the file system mounted at {full}" in _one_line(capsys)
    assert sorted(p.name for p in full.iterdir()) == ["pad"]


# --- 9 and 16. the SSD tier's directory ----------------------------------------------------------


def test_scm_dir_naming_a_file_or_below_a_file_is_one_line(world, tmp_path, capsys):
    f = tmp_path / "a_file"
    f.write_text("mine\n")
    for scm in (f, f / "below"):
        assert _run(world, tmp_path, "--out", str(tmp_path / "p.csv"), "--scm-dir", str(scm)) == 2
        assert "--scm-dir" in _one_line(capsys)
    assert f.read_text() == "mine\n"


def test_scm_dir_of_a_training_run_is_refused_before_a_byte_is_written(world, tmp_path, capsys):
    scm = tmp_path / "scm"
    scm.mkdir()
    tier = {"format": "hybrid-dlrm/scm-tier", "version": 1, "tier_id": "00" * 16,
            "owner": str(tmp_path / "run")}  # fmt: skip
    (scm / "tier.json").write_text(json.dumps(tier))
    (scm / "rows.dat").write_bytes(os.urandom(3 * 4096))
    (scm / "journal.log").write_bytes(b"")
    before = {p.name: p.read_bytes() for p in scm.iterdir()}
    assert _run(world, tmp_path, "--out", str(tmp_path / "p.csv"), "--scm-dir", str(scm)) == 2
    assert "training run" in _one_line(capsys)
    assert {p.name: p.read_bytes() for p in scm.iterdir()} == before
    # with its tier.json gone, the run's files are still not the artifact's
    (scm / "tier.json").unlink()
    with pytest.raises(ArtifactError, match="--scm-dir"):
        Predictor.load(world / "art", scm_dir=scm)
    assert (scm / "rows.dat").read_bytes() == before["rows.dat"]
    # a directory of the user's files is not a tier either
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine\n")
    with pytest.raises(ArtifactError, match=r"--scm-dir .*notes.txt"):
        Predictor.load(world / "art", scm_dir=other)
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"]


def test_scm_dir_of_the_serving_tier_is_reused(world, tmp_path):
    scm = tmp_path / "scm"
    Predictor.load(world / "art", scm_dir=scm, scm_io="buffered")
    p = Predictor.load(world / "art", scm_dir=scm, scm_io="buffered")
    assert p.model.embeddings.counters()["scm_copied_blocks"] == 0


# --- 17. --data ----------------------------------------------------------------------------------


def test_data_directory_that_is_not_a_dataset_is_named(world, tmp_path, capsys):
    d = tmp_path / "somedir"
    d.mkdir()
    rc = predict(["--model", str(world / "art"), "--data", str(d), "--out", str(tmp_path / "p")])
    assert rc == 2
    err = _one_line(capsys)
    assert "not found" not in err and "directory" in err and "meta.json" in err


# --- 14. CRLF line ends --------------------------------------------------------------------------


@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.usefixtures("starts_processes")
def test_crlf_lines_score_as_their_lf_lines(world, tmp_path, capsys, skip):
    lf = world / "raw" / "test.txt"
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes(lf.read_bytes().replace(b"\n", b"\r\n"))
    extra = ["--on-bad-line", "skip"] if skip else []
    assert predict(["--model", str(world / "art"), "--data", str(lf), "--out",
                    str(tmp_path / "lf.csv"), *extra]) == 0  # fmt: skip
    assert predict(["--model", str(world / "art"), "--data", str(crlf), "--out",
                    str(tmp_path / "crlf.csv"), *extra]) == 0  # fmt: skip
    assert (tmp_path / "crlf.csv").read_text() == (tmp_path / "lf.csv").read_text()


@pytest.mark.usefixtures("starts_processes")
def test_a_block_of_bad_lines_skipped_is_no_crash(world, tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    good = (world / "raw" / "test.txt").read_bytes().splitlines(keepends=True)[:3]
    bad.write_bytes(b"".join(good) + (b"\t".join([b"zz"] * 39) + b"\n") * 6000)  # 700 KB
    rc = predict(["--model", str(world / "art"), "--data", str(bad), "--out",
                  str(tmp_path / "p.csv"), "--on-bad-line", "skip", "--workers", "1",
                  "--block-mb", "0.25"])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    assert len((tmp_path / "p.csv").read_text().splitlines()) == 4
    assert json.loads(capsys.readouterr().out)["bad_lines"]["integer"] == 6000


def test_every_id_of_a_keyed_jagged_batch_is_checked_too(world):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    p = Predictor.load(world / "art")
    values = torch.zeros(26 * 3, dtype=torch.int64)
    values[5 * 3 + 1] = -1  # feature cat_5, sample 1
    kjt = KeyedJaggedTensor(keys=p.feature_names, values=values,
                            lengths=torch.ones(26 * 3, dtype=torch.int32))  # fmt: skip
    with pytest.raises(ValueError, match=r"row 1: id -1 of feature cat_5 is outside table t_cat_5"):
        p.predict((torch.zeros(3, 13), kjt))
    values[5 * 3 + 1] = 0
    values[25 * 3 + 2] = 97
    with pytest.raises(ValueError, match=r"row 2: id 97 of feature cat_25 is outside table"):
        p.predict((torch.zeros(3, 13), kjt))


def test_a_data_set_with_other_tables_is_one_line(tmp_path):
    """hybrid_dlrm.serving.predict on a preprocessed directory made for other tables than the model's (the
    walk's case: a synthetic run's artifact on Criteo columns) names the table up front."""
    import json
    from types import SimpleNamespace

    from data_pipeline.errors import DataError
    from hybrid_dlrm.serving.predict import predict_dataset

    (tmp_path / "meta.json").write_text(
        json.dumps({"dataset": "kaggle", "table_sizes": [15, 1460]})
    )
    tables = [SimpleNamespace(feature_name=f"cat_{i}", num_embeddings=15) for i in range(2)]
    model = SimpleNamespace(artifact=SimpleNamespace(tables=tables), manifest={})
    with pytest.raises(DataError, match=r"meta.json: table cat_1 has 1460 rows, the model's 15;"):
        predict_dataset(model, tmp_path, "test", None, 8)
    with pytest.raises(DataError, match=r"meta.json: 2 tables, the model has 1;"):
        predict_dataset(SimpleNamespace(artifact=SimpleNamespace(tables=tables[:1])), tmp_path,
                        "test", None, 8)  # fmt: skip


def test_the_library_face_of_quantize_raises_what_the_command_reports(world, tmp_path):
    """docs/library.md's `quantize([...])`: a mistake is an exception to catch, never a return
    code a script can miss and go on with (then loading an older artifact)."""
    from dlrm.errors import ConfigError
    from hybrid_dlrm.serving.quantize import quantize as quantize_lib

    with pytest.raises(ArtifactError, match="exists"):  # the artifact is there already
        quantize_lib([str(world / "run"), "--out", str(world / "art")])
    with pytest.raises(ConfigError, match="unrecognized arguments: --bogus"):
        quantize_lib([str(world / "run"), "--bogus"])
    manifest = quantize_lib(
        [str(world / "run"), "--out", str(tmp_path / "a"), "--batch-size", "256"]
    )
    assert manifest["bytes"]["model_bytes"] > 0 and (tmp_path / "a" / "manifest.json").exists()


def test_a_batch_of_other_features_is_one_line_naming_both(world):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    p = Predictor.load(world / "art")
    names = ["cat_0", "cat_1", "cat_2", "cat_3"]
    kjt = KeyedJaggedTensor(keys=names, values=torch.zeros(8, dtype=torch.int64),
                            lengths=torch.ones(8, dtype=torch.int32))  # fmt: skip
    with pytest.raises(ValueError) as e:
        p.predict((torch.zeros(2, 13), kjt))
    assert str(e.value) == (
        "the batch's features (cat_0, cat_1, cat_2, cat_3) are not the artifact's "
        "(26: cat_0, cat_1, ..., cat_25), in its order"
    )

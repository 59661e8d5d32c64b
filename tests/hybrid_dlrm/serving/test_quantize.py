"""Export (`python -m hybrid_dlrm.serving.quantize`), the artifact's verification, the dense conversions, the
precision search, the numeric debugger, the accuracy monitor and the reference's flags."""

import json
import math

import numpy as np
import pytest
import torch
import torch.ao.nn.quantized.dynamic as nnqd
from torch import nn

from dlrm import TrainConfig, Trainer
from dlrm.models.dlrm import NarrowInputLinear
from dlrm.models.quantized import Bf16Linear, convert_dense, from_float_state, linear_paths
from dlrm.models.tbsm import TBSM, TBSMArch
from embeddings.config import tables_for_features
from embeddings.fused import FusedEmbeddingBagCollection
from hybrid_dlrm.common.manifest import seal
from hybrid_dlrm.serving import Predictor
from hybrid_dlrm.serving.artifact import ArtifactError, read_manifest
from hybrid_dlrm.serving.artifact import load as load_artifact
from hybrid_dlrm.serving.inference_data import data_source, load_source, take_batches
from hybrid_dlrm.serving.quantize import main

TINY = dict(
    arch_embedding_size=(60, 40, 500, 8), arch_sparse_feature_size=4, arch_mlp_bot=(13, 16, 4),
    arch_mlp_top=(16, 1), mini_batch_size=64, data_size=64 * 30, test_data_size=1024,
    learning_rate=0.1, progress=False,
)  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory, long_training):  # a tiny epoch
    d = tmp_path_factory.mktemp("quant")
    cfg = TrainConfig(**TINY, out_dir=str(d / "run"), save_model=str(d / "model.pt"))
    Trainer(cfg).fit()
    return d


@pytest.fixture(scope="module")
def int8(run):
    out = run / "int8"
    assert (
        main(
            [str(run / "run"), "--out", str(out), "--mlp-precision", "int8", "--batch-size", "256"]
        )
        == 0
    )
    return out


def test_every_linear_layer_is_quantized_narrow_ones_included():
    tables = tables_for_features([10, 20], 4)
    from dlrm.models.dlrm import DLRM, DLRMArch

    model = DLRM(DLRMArch(13, 4, 2, (13, 16, 4), (32, 16, 1)), FusedEmbeddingBagCollection(tables))
    assert isinstance(model.bottom_mlp[0], NarrowInputLinear)  # 13 inputs: the narrow layout
    # torch's own dynamic quantization swaps exact nn.Linear types only: the narrow layer stays fp32
    torch_way = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    assert isinstance(torch_way.bottom_mlp[0], NarrowInputLinear)
    paths = linear_paths(model)
    assert paths == ["bottom_mlp.0", "bottom_mlp.2", "top_mlp.0", "top_mlp.2", "top_mlp.4"]
    layers = convert_dense(model, "int8")
    assert layers == dict.fromkeys(paths, "int8")
    assert all(isinstance(model.get_submodule(p), nnqd.Linear) for p in paths)
    assert not any(isinstance(m, nn.Linear) for m in model.modules())


def test_bf16_layers_hand_float32_on_at_the_end_of_each_mlp_but_the_bottom_one():
    tables = tables_for_features([10, 20], 4)
    arch = TBSMArch(1, 4, 2, (1, 4), (6, 6), ts_length=3, tsl_num_heads=2)
    model = TBSM(arch, FusedEmbeddingBagCollection(tables))
    paths = linear_paths(model)
    layers = convert_dense(model, "bf16")
    assert all(layers[p] == "bf16" for p in paths) and len(paths) == 15
    for p in paths:
        m = model.get_submodule(p)
        assert isinstance(m, Bf16Linear)
        nxt = p.rpartition(".")[0] + "." + str(int(p.rpartition(".")[2]) + 2)
        has_next = (
            isinstance(model.get_submodule(nxt), Bf16Linear) if _exists(model, nxt) else False
        )
        # the bottom MLP hands bf16 to the interaction (bf16 as under autocast in training)
        assert m.float_out == (not has_next and not p.startswith("step.bottom_mlp."))
        # a ReLU that followed the layer is fused into it
        after = p.rpartition(".")[0] + "." + str(int(p.rpartition(".")[2]) + 1)
        assert m.relu == (
            _exists(model, after) and isinstance(model.get_submodule(after), nn.Identity)
        )
    assert not any(isinstance(m, nn.ReLU) for m in model.modules())
    assert any(p.startswith("step.bottom_mlp.") for p in paths)
    assert layers["heads.0.A"] == "fp32 (not a linear layer)"


def _exists(model, path):
    try:
        model.get_submodule(path)
        return True
    except AttributeError:
        return False


def test_tbsm_exports_and_reloads_the_same_predictions(tmp_path):
    tables = tables_for_features([10, 20, 30], 4)
    arch = TBSMArch(1, 4, 3, (1, 4), (6, 6), ts_length=3, model_type="mha", mha_num_heads=2)
    float_model = TBSM(arch, FusedEmbeddingBagCollection(tables, seed=2), seed=2).eval()
    state = float_model.state_dict()
    model, layers = from_float_state(arch, tables, state, ["int4", "int8", "fp16"], "int8")
    assert layers["attention"].startswith("fp32 (MultiheadAttention")
    assert layers["query"] == "int8"
    from hybrid_dlrm.serving.artifact import ArtifactWriter
    from hybrid_dlrm.serving.model_tensors import arch_to_json, dense_tensors

    w = ArtifactWriter(tmp_path / "a")
    files = [w.tensor("tables", t.name, r) for t, r in zip(tables, model.embeddings.table_rows())]
    dense = {k: w.tensor("dense", k, v) for k, v in dense_tensors(model).items()}
    w.finish({
        "model": arch_to_json(arch),
        "tables": [{"name": t.name, "feature": t.feature_name, "rows": t.num_embeddings,
                    "dim": 4, "precision": p, "file": f}
                   for t, p, f in zip(tables, ["int4", "int8", "fp16"], files)],
        "dense": {"precision": "int8", "files": dense},
    })  # fmt: skip
    predictor = Predictor.load(tmp_path / "a")
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    n = 5 * 4  # 5 samples of 3 history steps and a candidate
    dense_in = torch.arange(n, dtype=torch.float32).view(n, 1) % 4
    ids = torch.cat([torch.arange(n) % s for s in (10, 20, 30)])
    kjt = KeyedJaggedTensor(keys=["cat_0", "cat_1", "cat_2"], values=ids,
                            lengths=torch.ones(3 * n, dtype=torch.int32))  # fmt: skip
    expected = torch.sigmoid(model(dense_in, kjt))
    assert torch.equal(predictor.predict((dense_in, kjt)), expected)
    assert predictor.predict((dense_in, kjt)).shape == (5,)


def test_export_writes_a_verifiable_artifact_that_predicts_as_the_model(run, int8):
    sealed = json.loads((int8 / "manifest.json").read_text())
    assert sealed["format"] == "hybrid-dlrm-inference-artifact" and sealed["format_version"] == 2
    manifest = read_manifest(int8)  # the sealed body, its CRC-32 checked
    assert [t["precision"] for t in manifest["tables"]] == ["int8"] * 4
    assert [t["rows"] for t in manifest["tables"]] == [60, 40, 500, 8]
    assert set(manifest["dense"]["layers"].values()) == {"int8"}
    assert manifest["calibration"]["split"] == "val"
    assert set(manifest["calibration"]["quantized"]) >= {"auc", "ne", "logloss", "calibration"}
    source = load_source(run / "run")
    assert manifest["source"]["sha256"] == source.sha256()
    for rel, rec in manifest["files"].items():  # every file listed, none can hold a pickle
        assert rel.endswith(".npy") and len(rec["sha256"]) == 64
        np.load(int8 / rel, allow_pickle=False)
    b = manifest["bytes"]
    assert b["table_bytes"] == sum((4 + 4) * n for n in (60, 40, 500, 8))
    assert b["model_bytes"] == b["table_bytes"] + b["dense_bytes"]
    # the artifact's predictions are those of the model quantized in memory
    model, _ = from_float_state(source.arch, source.tables, source.state, ["int8"] * 4, "int8")
    batch = next(iter(take_batches(data_source(source, None, "test", 128), 1).batches()))
    predictor = Predictor.load(int8)
    expected = torch.sigmoid(model(batch.dense_features, batch.sparse_features))
    assert torch.equal(predictor.predict(batch), expected)
    assert torch.equal(Predictor.load(int8, backend="torch").predict(batch), expected)


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_a_tampered_truncated_or_mismatched_artifact_is_refused(int8, tmp_path, capsys):
    table = "tables/t_cat_2.npy"
    bad = _copy(int8, tmp_path / "flipped")
    data = bytearray((bad / table).read_bytes())
    data[-3] ^= 1
    (bad / table).write_bytes(bytes(data))
    with pytest.raises(
        ArtifactError, match=rf"^{bad / table}: corrupt: its SHA-256 does not match"
    ):
        load_artifact(bad)
    short = _copy(int8, tmp_path / "short")
    (short / table).write_bytes((short / table).read_bytes()[:-10])
    with pytest.raises(ArtifactError, match=rf"^{short / table}: \d+ bytes, the manifest says"):
        load_artifact(short)
    # a consistent file of the wrong table: hashes right, shape wrong for the architecture
    other = _copy(int8, tmp_path / "other")
    np.save(other / table, np.zeros((7, 8), dtype=np.uint8))
    manifest = read_manifest(other)
    from hybrid_dlrm.serving.artifact import sha256_file

    manifest["files"][table].update(sha256=sha256_file(other / table), shape=[7, 8],
                                    bytes=(other / table).stat().st_size)  # fmt: skip
    head = {k: manifest.pop(k) for k in ("format", "format_version")}
    (other / "manifest.json").write_text(json.dumps({**head, **seal(manifest)}))  # resealed
    with pytest.raises(
        ArtifactError, match=r"t_cat_2.npy: torch.uint8 \(7, 8\) does not fit table"
    ):
        load_artifact(other)
    broken = _copy(int8, tmp_path / "broken")
    (broken / "manifest.json").write_text("{")
    with pytest.raises(ArtifactError, match="manifest.json: corrupt: not valid JSON"):
        load_artifact(broken)
    # the CLIs: one line, exit code 2
    from hybrid_dlrm.serving.predict import main as predict_main

    assert predict_main(["--model", str(bad), "--data", "x", "--out", str(tmp_path / "p.csv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "SHA-256 does not match" in err


def test_export_refuses_an_existing_artifact_and_bad_flags(run, int8, capsys):
    src = str(run / "run")
    assert main([src, "--out", str(int8)]) == 2
    assert "already exists" in capsys.readouterr().err
    cases = {
        (
            "--emb-precision",
            "int3",
        ): "--emb-precision: expected one of fp32, fp16, int8, int4, int2, auto",
        ("--emb-precision-table", "cat_9=int4"): "--emb-precision-table: no table 'cat_9'",
        ("--emb-precision-table", "cat_1=int2x"): "unknown precision 'int2x'",
        ("--mlp-precision", "fp8"): "--mlp-precision: expected one of fp32, bf16, int8",
    }
    for (flag, value), message in cases.items():
        assert main([src, "--out", str(run / "never"), flag, value]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1
    assert not (run / "never").exists()
    assert main([str(run / "missing"), "--out", str(run / "never")]) == 2
    assert "no such run directory" in capsys.readouterr().err


def test_per_table_overrides_and_model_files(run, capsys):
    out = run / "mixed"
    assert main([str(run / "model.pt"), "--out", str(out), "--emb-precision", "int4",
                 "--emb-precision-table", "cat_0=fp16,t_cat_3=int2"]) == 0  # fmt: skip
    manifest = read_manifest(out)
    assert [t["precision"] for t in manifest["tables"]] == ["fp16", "int4", "int4", "int2"]
    assert manifest["calibration"] is None  # a model file does not say where its data is


def test_auto_search_stays_within_budget_and_writes_its_record(run):
    out = run / "auto"
    assert main([str(run / "run"), "--out", str(out), "--emb-precision", "auto", "--batch-size", "256",
                 "--batches", "4", "--emb-precision-table", "cat_1=int8"]) == 0  # fmt: skip
    record = json.loads((out / "sensitivity.json").read_text())
    assert set(record["sensitivity"]) == {"cat_0", "cat_1", "cat_2", "cat_3"}
    assert set(record["sensitivity"]["cat_0"]["ne_change"]) == {
        "int2",
        "int4",
        "int8",
        "fp16",
        "fp32",
    }
    assert record["choice"]["cat_1"] == "int8"  # pinned
    final = record["verification"][-1]
    assert record["within_budget"] and final["ne_change"] <= record["budget"] == 0.001
    manifest = read_manifest(out)
    assert {t["feature"]: t["precision"] for t in manifest["tables"]} == record["choice"]
    # the exported model measured on the calibration batches: the search's own figure
    cal = manifest["calibration"]
    assert math.isclose(cal["ne_change"], final["ne_change"], abs_tol=1e-6)
    assert (out / "sensitivity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "sensitivity.png" in manifest["files"]


def test_debug_lists_sqnr_lowest_first_and_check_compares(run, int8, capsys):
    assert main([str(run / "run"), "--out", str(run / "dbg"), "--emb-precision", "int2",
                 "--debug", "--batches", "2", "--batch-size", "128"]) == 0  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    rows = [ln.split() for ln in lines[1:-1]]
    names = {r[-1] for r in rows}
    assert {"cat_0", "cat_3", "bottom_mlp.0", "top_mlp.2", "logits"} <= names
    values = [float(r[0]) for r in rows if r[0] != "exact"]
    assert values == sorted(values)
    tables = [r for r in rows if r[1] == "table"]
    assert all(r[2] == "int2" and float(r[0]) < 30 for r in tables)  # 2 bits: little signal left
    layers = [r for r in rows if r[1] == "layer"]
    assert all(r[0] == "exact" or float(r[0]) > 5 for r in layers)
    assert main(["--check", str(int8), "--against", str(run / "run"), "--batch-size", "256"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) >= {"reference", "quantized", "moved_share"}
    for side in ("reference", "quantized"):
        assert set(result[side]) >= {"auc", "ne", "logloss", "calibration"}
    assert result["samples"] == 1024 and 0.0 <= result["moved_share"] <= 1.0
    assert abs(result["quantized"]["auc"] - result["reference"]["auc"]) < 0.02


def test_reference_flags_evaluate_the_quantized_model(run, tmp_path):
    from dlrm.train import main as train_main

    args = ["--arch-embedding-size", "60-40-500-8", "--arch-sparse-feature-size", "4",
            "--arch-mlp-bot", "13-16-4", "--arch-mlp-top", "16-1", "--mini-batch-size", "64",
            "--test-data-size", "1024", "--inference-only", "--load-model", str(run / "model.pt")]  # fmt: skip
    assert train_main(args + ["--out-dir", str(tmp_path / "fp32")]) == 0
    assert train_main(args + ["--out-dir", str(tmp_path / "q"), "--quantize-emb-with-bit", "4",
                              "--quantize-mlp-with-bit", "8"]) == 0  # fmt: skip
    fp32 = json.loads((tmp_path / "fp32" / "summary.json").read_text())
    q = json.loads((tmp_path / "q" / "summary.json").read_text())
    assert q["placement"]["kind"] == "quantized" and q["placement"]["precisions"] == ["int4"] * 4
    assert q["test_samples"] == fp32["test_samples"] == 1024
    assert q["test_auc"] != fp32["test_auc"] and abs(q["test_auc"] - fp32["test_auc"]) < 0.02
    assert (
        train_main(args[:-3] + ["--quantize-emb-with-bit", "8", "--out-dir", str(tmp_path / "x")])
        == 2
    )


@pytest.mark.gpu
def test_predictor_serves_on_cuda_without_fbgemm_kernels(run, int8, tmp_path):
    out = tmp_path / "bf16"
    assert main([str(run / "run"), "--out", str(out), "--emb-precision", "int4",
                 "--mlp-precision", "bf16", "--batch-size", "256"]) == 0  # fmt: skip
    source = load_source(run / "run")
    batch = next(iter(take_batches(data_source(source, None, "test", 256), 1).batches()))
    cpu = Predictor.load(out).predict(batch)
    gpu = Predictor.load(out, device="cuda", backend="torch").predict(batch)
    torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-2, rtol=0)
    with pytest.raises(ArtifactError, match="int8 MLPs run on CPU only"):
        Predictor.load(int8, device="cuda")


def test_a_full_disk_leaves_no_partial_artifact(run, tmpfs, capsys):
    disk = tmpfs("size=16k")
    assert main([str(run / "run"), "--out", str(disk / "a"), "--batch-size", "256"]) == 2
    err = capsys.readouterr().err
    assert f"no space left on the file system mounted at {disk}" in err and err.count("\n") == 1
    assert list(disk.iterdir()) == []


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("shape", [(1, 13), (64, 13), (300, 367), (4, 5, 24)])
def test_bf16_linear_gives_the_bits_of_f_linear_then_relu(relu, shape):
    g = torch.Generator().manual_seed(len(shape) * 7 + shape[-1])
    w, b = torch.randn(32, shape[-1], generator=g), torch.randn(32, generator=g)
    x = torch.randn(*shape, generator=g)
    lin = Bf16Linear(w, b, float_out=True, relu=relu)
    expected = torch.nn.functional.linear(x.bfloat16(), w.bfloat16(), b.bfloat16())
    if relu:
        expected = torch.relu(expected)
    got = lin(x)
    assert got.dtype == torch.float32 and torch.equal(got, expected.float())


def test_bf16_linear_follows_a_weight_loaded_after_its_first_call():
    g = torch.Generator().manual_seed(5)
    w, b, x = torch.randn(16, 24, generator=g), torch.randn(16, generator=g), torch.randn(8, 24)
    lin = Bf16Linear(w, b, float_out=True, relu=False)
    first = lin(x)
    lin.load_state_dict({"weight": (2 * w).bfloat16(), "bias": b.bfloat16()})
    expected = torch.nn.functional.linear(x.bfloat16(), (2 * w).bfloat16(), b.bfloat16()).float()
    assert torch.equal(lin(x), expected) and not torch.equal(lin(x), first)

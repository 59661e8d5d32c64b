import json

from dlrm.perfmodel.graph import B1, B2, instantiate
from dlrm.perfmodel.model import ModelError, PerfModel


def _op(batch):
    return {"name": "aten::linear", "phase": "forward", "shapes": [[batch, 13], [64, 13], [64]],
            "kernels": [{"name": "aten::addmm", "stream": "cpu", "shapes": [[64], [batch, 13], [13, 64]],
                         "strides": [[1], [13, 1], [1, 13]], "out_shape": [batch * 26 + 1]}]}  # fmt: skip


def test_shapes_are_extrapolated_linearly_in_the_batch():
    template = {"meta": {"table_sizes": [3], "embedding_dim": 4}, "ops": [[_op(B1)], [_op(B2)]]}
    (op,) = instantiate(template, 4096)
    assert op["shapes"] == [[4096, 13], [64, 13], [64]]
    k = op["kernels"][0]
    assert k["shapes"][1] == [4096, 13] and k["out_shape"] == [4096 * 26 + 1]
    assert k["ctx"]["batch_size"] == 4096 and k["ctx"]["table_sizes"] == [3]


def test_cli_errors_are_one_line_exit_2(tmp_path, monkeypatch, capsys):
    from dlrm.perfmodel.__main__ import main

    monkeypatch.setenv("HYBRID_DLRM_CACHE", str(tmp_path / "cache"))
    missing = str(tmp_path / "missing.json")
    cases = [
        (["fit", "--bench", str(tmp_path / "nothing")], "no microbenchmark records"),
        (["predict", "--model", missing], "no performance model"),
        (["report", "--model", missing], "no performance model"),
        (
            ["microbench", "--out", str(tmp_path / "mb"), "--sweeps", "mlp,bogus"],
            "--sweeps: unknown bogus",
        ),
        (["predict", "--precision", "fp64", "--model", missing], "--precision"),
        (["fit"], "--bench"),
        (["frobnicate"], "invalid choice"),
    ]
    for args, message in cases:
        try:
            code = main(args)
        except SystemExit as e:  # argparse's own errors
            code = e.code
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2, (args, err)
        assert len(err) == 1 and "error" in err[0] and message in err[0], (args, err)


def test_model_file_errors(tmp_path):
    bad = tmp_path / "m.json"
    bad.write_text(json.dumps({"format": "else"}))
    for path, msg in (
        (bad, "not a hybrid-dlrm/perfmodel"),
        (tmp_path / "none.json", "no performance model"),
    ):
        try:
            PerfModel.load(path)
        except ModelError as e:
            assert msg in str(e)
        else:
            raise AssertionError("no error")

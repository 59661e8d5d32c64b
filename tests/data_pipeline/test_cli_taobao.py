"""`python -m data_pipeline` on Taobao: `synth --layout taobao` writes the planted
UserBehavior.csv the docs name, `preprocess --dataset taobao` makes a window directory of it, and
`info` summarises that directory as it does a Criteo one."""

from __future__ import annotations

import json

from data_pipeline.__main__ import main as cli
from data_pipeline.taobao import load_taobao_meta
from data_pipeline.taobao_synthetic import PlantedBehavior, write_user_behavior


def test_synth_preprocess_info_on_taobao(tmp_path, capsys):
    assert cli(["synth", "--layout", "taobao", "--out", str(tmp_path / "raw"), "--users", "40",
                "--seed", "3"]) == 0  # fmt: skip
    raw = tmp_path / "raw" / "UserBehavior.csv"
    assert json.loads(capsys.readouterr().out) == {"written": [str(raw)]}
    # the same bytes as the generator's own function with the same spec
    write_user_behavior(tmp_path / "ref.csv", PlantedBehavior(num_users=40, seed=3))
    assert raw.read_bytes() == (tmp_path / "ref.csv").read_bytes()

    out = tmp_path / "windows"
    assert cli(["preprocess", "--dataset", "taobao", "--raw", str(raw), "--out", str(out),
                "--ts-length", "4", "--no-progress"]) == 0  # fmt: skip
    capsys.readouterr()
    assert cli(["info", str(out)]) == 0
    info = json.loads(capsys.readouterr().out)
    meta = load_taobao_meta(out)
    assert info["dataset"] == "taobao" and info["ts_length"] == 4
    assert info["table_sizes"] == meta["table_sizes"]
    assert info["rows"] == {k: v["rows"] for k, v in meta["splits"].items()}
    assert info["rows"]["train"] > 0


def test_synth_taobao_injects_bad_lines_and_refuses_wrong_input(tmp_path, capsys):
    assert cli(["synth", "--layout", "taobao", "--out", str(tmp_path), "--users", "5",
                "--bad-lines", "user_id=2"]) == 0  # fmt: skip
    capsys.readouterr()
    lines = (tmp_path / "UserBehavior.csv").read_text().splitlines()
    assert sum(line.startswith("u7,") for line in lines) == 2
    for argv, message in [
        (["--users", "0"], "python -m data_pipeline synth: error: --users: expected a positive number of users, got 0\n"),
        (["--bad-lines", "label=1"], "python -m data_pipeline synth: error: --bad-lines: taobao kinds are field_count, user_id, "
                                     "behavior_type, timestamp, got label\n"),
    ]:  # fmt: skip
        assert cli(["synth", "--layout", "taobao", "--out", str(tmp_path / "x"), *argv]) == 2
        assert capsys.readouterr().err == message
    assert cli(["synth", "--layout", "kaggle", "--out", str(tmp_path / "k")]) == 2
    assert capsys.readouterr().err == (
        "python -m data_pipeline synth: error: --lines: expected a positive number of lines for --layout kaggle\n"
    )


def test_info_on_a_directory_that_is_neither_says_so(tmp_path, capsys):
    (tmp_path / "meta.json").write_text(json.dumps({"format": "something-else"}))
    assert cli(["info", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a preprocessed Criteo data set" in err

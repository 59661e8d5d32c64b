"""Recipes as files (dlrm/recipes/*.toml): every shipped file loads, each run takes exactly the
settings the old precedence code gave it (its dictionaries are written out below as the
reference), and a user's `--recipe FILE` applies under the flags given, is recorded in
config.json, and is refused with one line naming the file (and key) for every mistake."""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest

from dlrm import recipes
from dlrm.config import FLAT, NAMES, RECIPES, SECTIONS, TrainConfig
from dlrm.errors import ConfigError
from dlrm.models.kinds import KIND_NAMES
from dlrm.settings.sections import DATA_SETS
from dlrm.train import config_from_args, main

# --- the reference: dlrm/config.py's dictionaries and precedence before the files -------------

_KAGGLE = dict(
    arch_sparse_feature_size=16, arch_mlp_bot=(13, 512, 256, 64, 16), arch_mlp_top=(512, 256, 1)
)
OLD_ARCH = {
    ("dlrm", "synthetic"): _KAGGLE,
    ("dlrm", "kaggle"): _KAGGLE,
    ("dlrm", "terabyte"): dict(
        arch_sparse_feature_size=64, arch_mlp_bot=(13, 512, 256, 64), arch_mlp_top=(512, 512, 256, 1),
        max_ind_range=10_000_000,
    ),
    ("dlrm", "taobao"): dict(arch_sparse_feature_size=16, arch_mlp_bot=(1, 16), arch_mlp_top=(15, 1)),
    ("tbsm", "taobao"): dict(arch_sparse_feature_size=16, arch_mlp_bot=(1, 16), arch_mlp_top=(15, 15)),
}  # fmt: skip
OLD_TABLES = (
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10, 2209,
    11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
)  # fmt: skip
OLD_MULTI_HOT = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)
OLD_ARCH_GIVEN = ("arch_sparse_feature_size", "arch_mlp_bot", "arch_mlp_top", "arch_embedding_size")
OLD_BY_INTERACTION = {
    ("dlrm", "terabyte", "dcn"): dict(
        arch_sparse_feature_size=128, arch_mlp_bot=(13, 512, 256, 128),
        arch_mlp_top=(1024, 1024, 512, 256, 1), arch_embedding_size=OLD_TABLES,
        max_ind_range=40_000_000, dcn_num_layers=3, dcn_low_rank_dim=512, optimizer="adagrad",
        multi_hot_sizes=OLD_MULTI_HOT, contiguous_ids=True,
    ),
}  # fmt: skip


def _step(batch, test_batch, optimizer, lr):
    return dict(
        mini_batch_size=batch, test_mini_batch_size=test_batch, optimizer=optimizer,
        learning_rate=lr, lr_num_warmup_steps=0, lr_decay_start_step=0, lr_num_decay_steps=0,
    )  # fmt: skip


OLD_TRAINING = {
    ("dlrm", "kaggle"): _step(128, 16384, "sgd", 0.1),
    ("dlrm", "terabyte"): _step(2048, 16384, "sgd", 0.1),
    ("dlrm", "taobao"): _step(256, -1, "adagrad", 0.05),
    ("tbsm", "taobao"): _step(256, -1, "adagrad", 0.05),
}
OLD_PLAIN = _step(2048, -1, "sgd", 0.1)


def old_fill(given: dict) -> tuple[dict, dict]:
    """The old precedence: (every value filled, the ones printed), from the flat settings given."""
    model, data_set = given.get("model", "dlrm"), given.get("data_set", "synthetic")
    op = given.get("arch_interaction_op", "dot")
    defaults = {
        f.metadata["name"]: f.default for cls in SECTIONS.values() for f in dataclasses.fields(cls)
    }
    value = {**defaults, **given}
    reference = {**OLD_ARCH.get((model, data_set), OLD_ARCH[("dlrm", "kaggle")]),
                 **OLD_TRAINING.get((model, data_set), {})}  # fmt: skip
    by_op = OLD_BY_INTERACTION.get((model, data_set, op))
    if by_op and all(value[n] is None for n in OLD_ARCH_GIVEN):
        reference = {**reference, **by_op}
    printed = {n: v for n, v in reference.items() if value[n] is None}
    filled = {
        **printed,
        **{n: v for n, v in OLD_PLAIN.items() if value[n] is None and n not in printed},
    }
    return filled, printed


RUNS = list(itertools.product(("dlrm", "tbsm"), DATA_SETS, ("dot", "cat", "dcn")))  # the old ones
GIVEN = {
    "nothing": {},
    "an architecture flag": {"arch_mlp_top": (64, 1)},
    "training flags": {"optimizer": "rowwise_adagrad", "mini_batch_size": 64},
    "the whole architecture": {"arch_sparse_feature_size": 8, "arch_mlp_bot": (13, 8),
                               "arch_mlp_top": (4, 1), "arch_embedding_size": (10, 20)},
}  # fmt: skip


@pytest.mark.parametrize("given", GIVEN.values(), ids=GIVEN.keys())
@pytest.mark.parametrize("model,data_set,op", RUNS)
def test_every_run_takes_what_the_old_dictionaries_gave_it(model, data_set, op, given, tmp_path):
    flags = dict(
        model=model, data_set=data_set, arch_interaction_op=op, out_dir=str(tmp_path), **given
    )
    if data_set != "synthetic":
        flags["raw_data_file"] = "raw"
    filled, printed = old_fill(flags)
    cfg = TrainConfig(**flags)
    assert cfg.to_json() == TrainConfig(**flags, **filled).to_json()
    assert cfg.reference_defaults == printed
    assert list(cfg.reference_defaults) == list(printed)  # the start line's order too


def test_every_shipped_file_loads_and_sets_what_its_old_entry_set():
    by_file = {r.shown.removeprefix("dlrm/recipes/"): r for r in RECIPES}
    assert sorted(by_file) == sorted(
        ["kaggle.toml", "terabyte.toml", "terabyte-dcn.toml", "taobao-tbsm.toml",
         "taobao-dlrm.toml", "synthetic.toml"]
    )  # fmt: skip
    parsed = {name: _parsed(r) for name, r in by_file.items()}

    def old(model: str, data_set: str) -> dict:
        return {**OLD_ARCH[(model, data_set)], **OLD_TRAINING[(model, data_set)]}

    assert parsed["kaggle.toml"] == old("dlrm", "kaggle")
    assert parsed["terabyte.toml"] == old("dlrm", "terabyte")
    # the cross layers' 3 and 512 are those settings' own defaults, which a recipe never fills
    mlperf = OLD_BY_INTERACTION[("dlrm", "terabyte", "dcn")]
    dcn = {k: v for k, v in mlperf.items() if not k.startswith("dcn_")}
    assert parsed["terabyte-dcn.toml"] == {**old("dlrm", "terabyte"), **dcn}
    assert parsed["taobao-tbsm.toml"] == old("tbsm", "taobao")
    assert parsed["taobao-dlrm.toml"] == old("dlrm", "taobao")
    assert parsed["synthetic.toml"] == {**_KAGGLE, **OLD_PLAIN}
    assert set(by_file["synthetic.toml"].unprinted) == set(OLD_PLAIN)
    for name, r in by_file.items():
        assert r.source, name
        for model, data_set, op in r.default_for:  # a typo would match no run
            assert model in (*KIND_NAMES, "*") and data_set in (*DATA_SETS, "*"), name
            assert op in ("dot", "cat", "dcn", "*"), name
        for setting in r.settings:  # a reference recipe fills only what has no default of its own
            attr, field = FLAT[setting]
            default = next(f.default for f in dataclasses.fields(SECTIONS[attr]) if f.name == field)
            assert default is None, f"{name}: {setting} has a default ({default!r})"


def _parsed(r: recipes.Recipe) -> dict:
    """A file's settings as the sections hold them (tuples for dash-separated widths)."""
    cfg = TrainConfig(**{**r.settings, "data_set": "synthetic", "multi_hot_sizes": None})
    return {
        n: getattr(cfg, n) if n != "multi_hot_sizes" else tuple(v) for n, v in r.settings.items()
    }


def test_the_most_specific_declaration_comes_first_and_a_tie_is_refused():
    def recipe(name, *runs):
        return recipes.Recipe(shown=name, settings={}, default_for=runs)

    anything, kaggle = recipe("any", ("*", "*", "*")), recipe("kaggle", ("dlrm", "kaggle", "*"))
    both = [anything, kaggle]
    assert recipes.defaults_for(both, ("dlrm", "kaggle", "dot"), bool) == [kaggle, anything]
    assert recipes.defaults_for(both, ("tbsm", "kaggle", "dot"), bool) == [anything]
    tie = recipe("dot", ("dlrm", "*", "dot"))
    with pytest.raises(ConfigError, match="^recipes dot, kaggle are equally the default for dlrm"):
        recipes.defaults_for([kaggle, tie], ("dlrm", "kaggle", "dot"), bool)
    with pytest.raises(ConfigError, match="is the default for tbsm kaggle dot$"):
        recipes.defaults_for([kaggle], ("tbsm", "kaggle", "dot"), bool)


def test_what_a_recipe_leaves_unset_the_next_fills(monkeypatch):
    """A new default recipe need not repeat the quick step: synthetic.toml, the default of
    every run, fills what it leaves (unprinted, as before the files)."""
    trial = recipes.Recipe(
        shown="dlrm/recipes/trial.toml", settings={"arch_mlp_top": "8-1", "mini_batch_size": 64},
        default_for=(("tbsm", "kaggle", "*"),),
    )  # fmt: skip
    monkeypatch.setattr("dlrm.config.RECIPES", [*RECIPES, trial])
    cfg = TrainConfig(model="tbsm", data_set="kaggle", raw_data_file="raw")
    assert (cfg.arch_mlp_top, cfg.mini_batch_size, cfg.optimizer) == ((8, 1), 64, "sgd")
    assert list(cfg.reference_defaults) == [
        "arch_mlp_top", "mini_batch_size", "arch_sparse_feature_size", "arch_mlp_bot",
    ]  # fmt: skip
    assert cfg.describe_recipes()[0].endswith(
        "(dlrm/recipes/trial.toml, dlrm/recipes/synthetic.toml)"
    )


# --- a user's recipe -------------------------------------------------------------------------

TINY = """
arch_embedding_size = "30-20-10"
arch_sparse_feature_size = 4
arch_mlp_bot = [13, 8, 4]
arch_mlp_top = "8-1"
mini_batch_size = 32
optimizer = "adagrad"
data_size = 320
test_data_size = 256
progress = false
"""


def _write(path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_a_users_recipe_applies_under_the_flags_given(tmp_path):
    mine = _write(tmp_path / "mine.toml", TINY)
    cfg = config_from_args(
        ["--recipe", mine, "--mini-batch-size", "16", "--out-dir", str(tmp_path / "r")]
    )
    assert (cfg.mini_batch_size, cfg.optimizer, cfg.arch_mlp_bot) == (16, "adagrad", (13, 8, 4))
    assert cfg.run.recipe == mine and "mini_batch_size" not in cfg.recipe_settings
    assert {"recipe", "optimizer", "arch_mlp_bot", "mini_batch_size"} <= cfg.given  # the user's
    assert "learning_rate" not in cfg.given  # the reference recipe's
    # as if its settings were flags: the same config as giving them on the command line
    spelled = ["--arch-embedding-size", "30-20-10", "--arch-sparse-feature-size", "4", "--arch-mlp-bot",
               "13-8-4", "--arch-mlp-top", "8-1", "--optimizer", "adagrad", "--data-size", "320",
               "--test-data-size", "256", "--progress=false", "--mini-batch-size", "16",
               "--out-dir", str(tmp_path / "r")]  # fmt: skip
    assert cfg.to_json() == {**config_from_args(spelled).to_json(), "recipe": mine}
    # it counts as given: synthetic.toml fills only the rest (its unprinted training step)
    assert cfg.reference_defaults == {} and cfg.learning_rate == 0.1
    line = cfg.describe_recipes()[0]
    assert line.startswith(
        f"recipe {mine}: --arch-embedding-size 30-20-10 --arch-sparse-feature-size 4"
    )
    assert "--progress false" in line and "--mini-batch-size" not in line


def test_a_shipped_file_is_a_users_recipe_too(tmp_path):
    dcn = "dlrm/recipes/terabyte-dcn.toml"
    cfg = config_from_args(["--recipe", dcn, "--data-set", "terabyte", "--raw-data-file", "raw",
                            "--arch-mlp-top", "512-1"])  # fmt: skip
    # a user's recipe is given: MLPerf's tables stay though an architecture flag was given too
    assert cfg.arch_embedding_size == OLD_TABLES and cfg.arch_mlp_top == (512, 1)
    assert cfg.optimizer == "adagrad" and cfg.reference_defaults == {}


def test_the_recipe_is_recorded_and_a_saved_config_does_not_read_it_again(tmp_path, capsys):
    mine = tmp_path / "mine.toml"
    _write(mine, TINY)
    run = tmp_path / "r"
    rc = main(
        ["--recipe", str(mine), "--num-batches", "2", "--print-freq", "0", "--out-dir", str(run)]
    )
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert f"recipe {mine}: --arch-embedding-size 30-20-10" in out.out
    saved = json.loads((run / "config.json").read_text())
    assert saved["recipe"] == str(mine) and saved["optimizer"] == "adagrad"
    mine.unlink()  # moved away: the run's own config still loads, with every value it set
    again = TrainConfig.from_json(saved)
    assert again.run.recipe == str(mine) and again.to_json() == saved
    assert again.given == frozenset(k for k, v in saved.items() if v is not None)


@pytest.mark.parametrize(
    "text, message",
    [
        (None, "no such file"),
        ("", "cannot read it (Is a directory)"),
        ("mini_batch_size = \nlr = 1", "not valid TOML (Invalid value (at line 1, column 19))"),
        (b"optimizer = '\xff'", "not UTF-8 text"),
        ("batch = 3", "no setting named 'batch' (keys are settings' flat names"),
        ("dist-timeout = 3", "no setting named 'dist-timeout' (its name is dist_timeout_s)"),
        ("[training]\nmini_batch_size = 3", "no setting named 'training'"),
        ("mini_batch_size = 0", "mini_batch_size: expected a positive integer, got 0"),
        ('optimizer = "adam"', "optimizer: expected one of sgd, adagrad, rowwise_adagrad, got 'adam'"),
        ('arch_mlp_bot = "13-x"', "arch_mlp_bot: expected dash-separated integers like 13-512-256"),
        ("learning_rate = 'fast'", "learning_rate: expected a number, got 'fast'"),
        ('recipe = "other.toml"', "recipe: a recipe cannot name another recipe"),
        ("default_for = 3", "default_for: expected a list of tables like"),
    ],
)  # fmt: skip
def test_a_bad_recipe_is_one_line_naming_the_file_and_exit_2(text, message, tmp_path, capsys):
    path = tmp_path / "mine.toml"
    if text == "":
        path.mkdir()
    elif isinstance(text, bytes):
        path.write_bytes(text)
    elif text is not None:
        path.write_text(text)
    rc = main(["--recipe", str(path), "--out-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"python -m dlrm.train: error: --recipe {path}: {message}"), err
    assert not (tmp_path / "r").exists()


def test_a_flag_given_wins_over_a_bad_value_in_the_recipe(tmp_path):
    mine = _write(tmp_path / "mine.toml", "mini_batch_size = 0\n")
    assert config_from_args(["--recipe", mine, "--mini-batch-size", "8"]).mini_batch_size == 8


def test_the_names_of_recipe_files_are_every_settings_flat_name():
    assert set(NAMES) == set(FLAT) and "recipe" in NAMES

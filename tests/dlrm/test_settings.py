"""Settings per capability: the flags, the docs tables, the resume rules and config.json all come
from the fields' metadata (dlrm/settings/), and the flat names of every run so far keep working."""

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dlrm.config import FLAT, SECTIONS, SETTINGS, TrainConfig
from dlrm.errors import ConfigError
from dlrm.flags import DOCS, docs_block, tables
from dlrm.run_checks import FREE
from dlrm.train import build_parser

ROOT = Path(__file__).resolve().parents[2]


def test_every_setting_has_exactly_one_flag_and_every_flag_one_setting():
    actions = [a for a in build_parser()._actions if not isinstance(a, argparse._HelpAction)]
    by_dest = {}
    for a in actions:
        assert a.dest not in by_dest, f"two arguments for {a.dest}"
        by_dest[a.dest] = a
    settings = {f.metadata["name"]: f for f in SETTINGS}
    assert set(by_dest) == set(settings) == set(FLAT)
    for name, f in settings.items():
        flags = (f.metadata["flag"], *f.metadata["aliases"])
        assert tuple(by_dest[name].option_strings) == flags
    spelled = [s for a in actions for s in a.option_strings]
    assert len(spelled) == len(set(spelled))


def test_help_shows_every_default():
    for a in build_parser()._actions:
        if not isinstance(a, argparse._HelpAction):
            assert "(default: " in a.help, a.option_strings


def test_help_is_answered_without_torch():
    code = (
        "import sys; from dlrm.train import build_parser; build_parser().format_help(); "
        "heavy = [m for m in ('torch', 'fbgemm_gpu', 'torchrec', 'numpy') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("name", sorted(DOCS))
def test_docs_flag_tables_are_the_generated_ones(name):
    text = (ROOT / DOCS[name]).read_text()
    assert docs_block(text, name) == tables()[name], (
        f"{DOCS[name]} is out of date: python -m dlrm.flags --update-docs"
    )


def test_the_training_table_lists_every_flag():
    table = tables()["training"]
    for f in SETTINGS:
        assert f"`{f.metadata['flag']}`" in table


def test_flat_names_construct_read_and_assign(tmp_path):
    cfg = TrainConfig(mini_batch_size=256, optimizer="adagrad", arch_embedding_size="30-20",
                      slipstream=True, dist_timeout_s=60, out_dir=str(tmp_path))  # fmt: skip
    assert cfg.training.mini_batch_size == cfg.mini_batch_size == 256
    assert cfg.arch.embedding_size == cfg.arch_embedding_size == (30, 20)
    assert cfg.slipstreaming.enabled is cfg.slipstream is True
    assert cfg.distributed.timeout_s == cfg.dist_timeout_s == 60.0
    assert cfg.eval_batch_size == 256 and cfg.run_dir == tmp_path
    cfg.test_mini_batch_size = 512
    assert cfg.training.test_mini_batch_size == 512 and cfg.eval_batch_size == 512
    with pytest.raises(AttributeError):
        cfg.no_such_setting  # noqa: B018


def test_replace_copies_the_sections(tmp_path):
    cfg = TrainConfig(out_dir=str(tmp_path), learning_rate=0.5)
    again = dataclasses.replace(cfg, resume="auto")
    assert again.resume == "auto" and cfg.resume is None and again.learning_rate == 0.5
    assert again.run is not cfg.run


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(learning_rate="fast"), "--learning-rate: expected a number, got 'fast'"),
        (dict(mini_batch_size="64"), "--mini-batch-size: expected an integer, got '64'"),
        (dict(slipstream=1), "--slipstream: expected true or false, got 1"),
        (dict(speed=3), "TrainConfig: no setting named 'speed'"),
        (
            dict(hotline_learn_batches=-1),
            "--hotline-learn-batches: expected a non-negative integer",
        ),
        (dict(placement="tiered", hotline_learn_batches=5), "--hotline-learn-batches: not with"),
    ],
)
def test_a_wrong_type_or_name_is_a_config_error_naming_it(settings, message, tmp_path):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(")):
        TrainConfig(out_dir=str(tmp_path), **settings)


def test_config_json_flat_and_nested_both_load(tmp_path):
    cfg = TrainConfig(out_dir=str(tmp_path), data_size=640, slipstream=True, scm_io="buffered",
                      arch_mlp_bot=(13, 8, 16), sharding="table_wise")  # fmt: skip
    flat, nested = cfg.to_json(), cfg.to_json(nested=True)
    assert set(flat) == set(FLAT) and set(nested) == set(SECTIONS)
    assert flat["slipstream"] is True and nested["slipstreaming"]["enabled"] is True
    for doc in (flat, nested):
        assert TrainConfig.from_json(json.loads(json.dumps(doc))) == cfg
    with pytest.raises(ConfigError, match="config: unknown fields bogus, run.nope"):
        TrainConfig.from_json({"bogus": 1, "run": {"nope": 2}})


def test_an_older_runs_config_json_loads(tmp_path):
    # as to_json wrote it before the sections (a subset: older runs lack the newer settings)
    old = {"model": "dlrm", "arch_sparse_feature_size": 16, "arch_embedding_size": [60, 40],
           "arch_mlp_bot": [13, 512, 256, 64, 16], "arch_mlp_top": [512, 256, 1], "seed": 7,
           "mini_batch_size": 64, "allow_changed": ["learning_rate"], "compile": None,
           "dist_timeout_s": 300.0, "slipstream": False, "out_dir": str(tmp_path)}  # fmt: skip
    cfg = TrainConfig.from_json(old)
    assert cfg.seed == 7 and cfg.arch_embedding_size == (60, 40)
    assert cfg.allow_changed == ("learning_rate",) and cfg.reference_defaults == {}


def test_resume_rules_come_from_the_metadata():
    free = {f.metadata["name"] for f in SETTINGS if f.metadata["free"]}
    assert FREE == free
    assert {"nepochs", "print_freq", "scm_cache", "dist_timeout_s"} <= FREE
    assert not {"learning_rate", "seed", "placement", "mini_batch_size"} & FREE


def test_a_section_checks_itself_when_made():
    from dlrm.settings.placement import ScmConfig, SlipstreamConfig

    assert SlipstreamConfig(enabled=True, mode="freeze").mode == "freeze"
    with pytest.raises(ConfigError, match="--slipstream-mode: expected one of drop, freeze"):
        SlipstreamConfig(mode="skip")
    with pytest.raises(ConfigError, match="--scm-io-engine aio: needs --scm-io direct"):
        ScmConfig(io="buffered", io_engine="aio")


def test_a_flag_written_out_is_given_even_at_its_default(tmp_path):
    from dlrm.placement.auto import rows_cap
    from dlrm.train import config_from_args

    out = ["--out-dir", str(tmp_path)]
    written = config_from_args(["--hot-budget", "256MB", *out])
    assert "hot_budget" in written.given and rows_cap(written) == 256 * 2**20
    left_out = config_from_args(out)
    assert "hot_budget" not in left_out.given and rows_cap(left_out) is None
    assert left_out.placing.hot_budget == written.placing.hot_budget  # the same value either way
    assert TrainConfig(hot_budget="256MB", out_dir=str(tmp_path)).given >= {"hot_budget"}
    assert "hot_budget" not in TrainConfig(arch_mlp_bot=None, out_dir=str(tmp_path)).given
    assert "arch_mlp_bot" not in TrainConfig(arch_mlp_bot=None, out_dir=str(tmp_path)).given


def test_a_byte_size_is_parsed_once_and_shown_as_written(tmp_path):
    cfg = TrainConfig(
        hot_budget="1.5GB", scm_cache=4096, memory_limit="24 GB", out_dir=str(tmp_path)
    )
    assert cfg.placing.hot_budget.bytes == 3 * 2**29 and str(cfg.placing.hot_budget) == "1.5GB"
    assert cfg.scm.cache.bytes == 4096 and cfg.placing.memory_bytes() == 24 * 2**30
    flat = cfg.to_json()
    assert (flat["hot_budget"], flat["scm_cache"], flat["memory_limit"]) == ("1.5GB", 4096, "24 GB")
    assert cfg.to_json(nested=True)["placing"]["hot_budget"] == "1.5GB"
    for form in (flat, cfg.to_json(nested=True)):
        again = TrainConfig.from_json(json.loads(json.dumps(form)))
        assert again.placing == cfg.placing and again.scm == cfg.scm
    with pytest.raises(ConfigError, match=r"^--scm-cache: expected a size like 256MB"):
        TrainConfig(scm_cache="lots", out_dir=str(tmp_path))
    with pytest.raises(
        ConfigError, match=r"^--hot-budget: expected a string or an integer, got 1.5$"
    ):
        TrainConfig(hot_budget=1.5, out_dir=str(tmp_path))


def test_replace_derives_a_checked_config_that_keeps_what_was_given(tmp_path):
    cfg = TrainConfig(out_dir=str(tmp_path), learning_rate=0.5)
    fae = cfg.replace(placement="fae", hot_budget=2**20)
    assert fae.placing.placement == "fae" and fae.placing.hot_budget.bytes == 2**20
    assert cfg.placing.placement == "device" and fae.placing is not cfg.placing
    assert fae.given == cfg.given | {"placement", "hot_budget"}
    assert fae.training.learning_rate == 0.5 and fae.to_json()["hot_budget"] == 2**20
    with pytest.raises(ConfigError, match="^--embedding-init hashed"):
        cfg.replace(placement="host", embedding_init="hashed")


def test_one_sparse_optimizer_factory_on_the_training_section(tmp_path):
    opt = TrainConfig(optimizer="adagrad", learning_rate=0.3, out_dir=str(tmp_path))
    made = opt.training.sparse_optimizer()
    assert (made.kind, made.learning_rate) == ("adagrad", 0.3)

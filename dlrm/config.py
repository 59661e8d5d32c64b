"""Training configuration: one section per capability (dlrm/settings/), each field one flag.

    TrainConfig(mini_batch_size=256, optimizer="adagrad", out_dir="runs/a")   # flat names
    cfg.training.mini_batch_size, cfg.slipstreaming.mode                       # the sections
    cfg.mini_batch_size                                                        # flat reads too

A flat name is the flag without its dashes (`--numpy-rand-seed` is `seed`, `--dist-timeout` is
`dist_timeout_s`, `--slipstream` is `slipstream`); config.json holds the flat names, as it
always has, and `from_json` also reads the sections' nested form.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from dlrm.errors import ConfigError
from dlrm.models.kinds import model_kind
from dlrm.settings.fields import ByteSize
from dlrm.settings.model import ArchConfig, TbsmConfig
from dlrm.settings.placement import (
    FaeConfig,
    HotlineConfig,
    PlacementConfig,
    ScmConfig,
    SlipstreamConfig,
)
from dlrm.settings.sections import DataConfig, DistributedConfig, RunConfig, TrainingConfig

# The reference recipes (facebookresearch/dlrm's bench/dlrm_s_criteo_kaggle.sh and
# dlrm_s_criteo_terabyte.sh, facebookresearch/tbsm's bench/tbsm_bench.sh) for the fields a run
# does not set: the architecture and the training step. The synthetic data is Kaggle-shaped and
# takes Kaggle's architecture; DLRM on Taobao is the candidate-step baseline TBSM is compared
# with (scripts/bench_tbsm_vs_dlrm.py), trained as TBSM is.
_KAGGLE = dict(
    arch_sparse_feature_size=16, arch_mlp_bot=(13, 512, 256, 64, 16), arch_mlp_top=(512, 256, 1)
)
REFERENCE_ARCH: dict[tuple[str, str], dict] = {
    ("dlrm", "synthetic"): _KAGGLE,
    ("dlrm", "kaggle"): _KAGGLE,
    ("dlrm", "terabyte"): dict(
        arch_sparse_feature_size=64, arch_mlp_bot=(13, 512, 256, 64), arch_mlp_top=(512, 512, 256, 1),
        max_ind_range=10_000_000,
    ),
    ("dlrm", "taobao"): dict(arch_sparse_feature_size=16, arch_mlp_bot=(1, 16), arch_mlp_top=(15, 1)),
    ("tbsm", "taobao"): dict(arch_sparse_feature_size=16, arch_mlp_bot=(1, 16), arch_mlp_top=(15, 15)),
}  # fmt: skip

# MLPerf's DLRM-DCNv2 (since 2023; its reference is torchrec's DLRM example): one more entry per
# (model, data set, interaction), over the data set's own. Adagrad is the reference's optimizer;
# it fills `--optimizer` only where that setting has no default of its own.
MLPERF_DCNV2_TABLES = (
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10, 2209,
    11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
)  # fmt: skip
# MLPerf's bags: ids per sample and feature, materialised from the one-hot days (docs/data.md)
MLPERF_DCNV2_MULTI_HOT = (
    3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1,
)  # fmt: skip
# architecture fields of the cross layers: in the signature of a dcn model only
DCN_FIELDS = ("dcn_num_layers", "dcn_low_rank_dim")
# the architecture flags whose absence lets an interaction's entry apply
ARCH_GIVEN = ("arch_sparse_feature_size", "arch_mlp_bot", "arch_mlp_top", "arch_embedding_size")
REFERENCE_BY_INTERACTION: dict[tuple[str, str, str], dict] = {
    ("dlrm", "terabyte", "dcn"): dict(
        arch_sparse_feature_size=128, arch_mlp_bot=(13, 512, 256, 128),
        arch_mlp_top=(1024, 1024, 512, 256, 1), arch_embedding_size=MLPERF_DCNV2_TABLES,
        max_ind_range=40_000_000, dcn_num_layers=3, dcn_low_rank_dim=512, optimizer="adagrad",
        multi_hot_sizes=MLPERF_DCNV2_MULTI_HOT,
    ),
}  # fmt: skip


def _step(batch: int, test_batch: int, optimizer: str, lr: float, warmup=0, decay_start=0, decay=0):
    return dict(
        mini_batch_size=batch, test_mini_batch_size=test_batch, optimizer=optimizer,
        learning_rate=lr, lr_num_warmup_steps=warmup, lr_decay_start_step=decay_start,
        lr_num_decay_steps=decay,
    )  # fmt: skip


# The training step of each reference run (neither dlrm script sets --optimizer or a schedule:
# the reference's defaults, SGD and a constant rate; tbsm_pytorch.py always trains with Adagrad
# and one batch size for training and evaluation).
_TBSM_STEP = _step(256, -1, "adagrad", 0.05)
REFERENCE_TRAINING: dict[tuple[str, str], dict] = {
    ("dlrm", "kaggle"): _step(128, 16384, "sgd", 0.1),
    ("dlrm", "terabyte"): _step(2048, 16384, "sgd", 0.1),
    ("dlrm", "taobao"): _TBSM_STEP,
    ("tbsm", "taobao"): _TBSM_STEP,
}
# The synthetic data set is this project's demonstration, not a reference run: a large batch,
# so the default run finishes in about a minute. Not printed (no reference to name).
PLAIN_TRAINING = _step(2048, -1, "sgd", 0.1)


# The sections, in the order --help and the docs list them: attribute -> class. No attribute
# is also a flat name (`placement` and `slipstream` are flags, hence `placing`, `slipstreaming`).
SECTIONS: dict[str, type] = {
    "arch": ArchConfig,
    "tbsm": TbsmConfig,
    "data": DataConfig,
    "training": TrainingConfig,
    "placing": PlacementConfig,
    "fae": FaeConfig,
    "hotline": HotlineConfig,
    "scm": ScmConfig,
    "slipstreaming": SlipstreamConfig,
    "distributed": DistributedConfig,
    "run": RunConfig,
}
# every setting's field, and flat name -> (section attribute, field name)
SETTINGS = [f for cls in SECTIONS.values() for f in dataclasses.fields(cls)]
FLAT: dict[str, tuple[str, str]] = {
    f.metadata["name"]: (attr, f.name)
    for attr, cls in SECTIONS.items()
    for f in dataclasses.fields(cls)
}
assert not set(FLAT) & set(SECTIONS), "a section named like a flag"


# Flat names are the edges' vocabulary (the command line, config.json, the constructor): inside
# the product a feature reads its own section, so a flat read from these packages is a bug.
PRODUCT = ("dlrm", "embeddings", "data_pipeline", "perfmodel", "hybrid_dlrm")
EDGES = ("dlrm.config", "dlrm.flags")


class FlatNameRead(RuntimeError):
    """A module of the product read or wrote a setting by its flat name. Not an AttributeError, so
    that `getattr(cfg, name, default)` cannot quietly turn it into a default."""


def _at_an_edge(name: str, where: tuple[str, str]) -> None:
    caller = sys._getframe(2).f_globals.get("__name__", "")
    if caller.split(".")[0] in PRODUCT and caller not in EDGES:
        raise FlatNameRead(
            f"{caller}: reads the flat setting {name!r}; read its section, "
            f"cfg.{where[0]}.{where[1]} (flat names are for the command line, config.json and "
            "the TrainConfig(...) constructor)"
        )


def _plain(section, name: str):
    """A setting's value as config.json holds it (a byte size as it was given)."""
    value = getattr(section, name)
    return value.to_json() if isinstance(value, ByteSize) else value


@dataclass(init=False)
class TrainConfig:
    """A run's settings: one section per capability, each checked when made; the rules between
    sections in `check`. Every flat name reads and assigns through to its section."""

    arch: ArchConfig
    tbsm: TbsmConfig
    data: DataConfig
    training: TrainingConfig
    placing: PlacementConfig
    fae: FaeConfig
    hotline: HotlineConfig
    scm: ScmConfig
    slipstreaming: SlipstreamConfig
    distributed: DistributedConfig
    run: RunConfig

    def __init__(self, **settings) -> None:
        """Flat names (`mini_batch_size=256`) and whole sections (`slipstreaming=...`, as
        `dataclasses.replace` passes them); a flat name wins over its section's value."""
        given: dict[str, dict] = {attr: {} for attr in SECTIONS}
        sections = {}
        for key, value in settings.items():
            if key in SECTIONS and isinstance(value, SECTIONS[key]):
                sections[key] = value
            elif key in FLAT:
                attr, name = FLAT[key]
                given[attr][name] = value
            else:
                raise ConfigError(f"TrainConfig: no setting named {key!r}")
        for attr, cls in SECTIONS.items():
            base = sections.get(attr)  # copied: a replaced config shares no section with its source
            section = dataclasses.replace(base, **given[attr]) if base else cls(**given[attr])
            object.__setattr__(self, attr, section)
        # the flat names the user set (a flag on the command line, a keyword, a key of
        # config.json), whatever the value: `--hot-budget 256MB` is given though it is the
        # default. None is "not given" (the settings' own meaning: filled from a recipe).
        self.given = frozenset(k for k, v in settings.items() if k in FLAT and v is not None)
        self.reference_defaults = self._fill_reference_defaults()
        self.check()

    def __getattr__(self, name: str):  # only for names that are not attributes: the flat ones
        where = FLAT.get(name)
        if where is None or where[0] not in self.__dict__:
            raise AttributeError(f"'TrainConfig' object has no attribute {name!r}")
        _at_an_edge(name, where)
        return getattr(self.__dict__[where[0]], where[1])

    def __setattr__(self, name: str, value) -> None:
        where = FLAT.get(name)
        if where is None:
            object.__setattr__(self, name, value)
        else:
            _at_an_edge(name, where)
            setattr(getattr(self, where[0]), where[1], value)

    def _fill_reference_defaults(self) -> dict:
        """Fields left None take the data set's reference configuration; returns what was filled
        (so it can be printed at start)."""
        key = (self.model, self.data_set)
        reference = {
            **REFERENCE_ARCH.get(key, REFERENCE_ARCH[("dlrm", "kaggle")]),
            **REFERENCE_TRAINING.get(key, {}),
        }
        by_op = REFERENCE_BY_INTERACTION.get((self.model, self.data_set, self.arch_interaction_op))
        if by_op and not self.given.intersection(ARCH_GIVEN):
            reference = {**reference, **by_op}  # only without other architecture flags
        filled = {}
        for name, value in reference.items():
            if getattr(self, name) is None:
                setattr(self, name, value)
                filled[name] = value
        for name, value in PLAIN_TRAINING.items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        return filled

    def describe_reference_defaults(self) -> str:
        """One line: the reference settings this run took for fields it was not given."""
        if not self.reference_defaults:
            return ""
        shown = []
        for name, value in self.reference_defaults.items():
            text = "-".join(map(str, value)) if isinstance(value, tuple) else str(value)
            shown.append(f"--{name.replace('_', '-')} {text}")
        return f"{self.model} on {self.data_set}: reference settings {' '.join(shown)}"

    def check(self) -> None:
        """The rules between sections (each section checked its own when it was made), and the
        training section's again now that the recipe filled what it was not given."""
        self.training.check()
        if self.slipstream and self.hotline_learn_batches:
            raise ConfigError(
                "--slipstream: tracks the plan's hot rows, which --hotline-learn-batches only "
                "knows after training has begun; plan from a profile instead"
            )
        if self.placement == "tiered" and self.hotline_learn_batches:
            raise ConfigError(
                "--hotline-learn-batches: not with --placement tiered (its plan is fixed)"
            )

    def replace(self, **changes) -> TrainConfig:
        """This configuration with `changes` (flat names, or whole sections), checked as a new
        one: the one way a changed configuration is derived. What was given stays given, and
        the changes are given too."""
        out = TrainConfig(**{attr: getattr(self, attr) for attr in SECTIONS}, **changes)
        out.given = self.given | out.given
        return out

    def validate(self) -> None:
        """Every rule again (after fields were assigned one by one)."""
        for attr in SECTIONS:
            object.__setattr__(self, attr, dataclasses.replace(getattr(self, attr)))
        self.check()

    @property
    def eval_batch_size(self) -> int:
        return (
            self.mini_batch_size if self.test_mini_batch_size == -1 else self.test_mini_batch_size
        )

    def to_json(self, nested: bool = False) -> dict:
        """The settings by flat name (config.json), or with `nested` by section."""
        if nested:
            out = {
                attr: {f.name: _plain(getattr(self, attr), f.name) for f in dataclasses.fields(cls)}
                for attr, cls in SECTIONS.items()
            }
            return json.loads(json.dumps(out))
        flat = {name: _plain(getattr(self, attr), f) for name, (attr, f) in FLAT.items()}
        return json.loads(json.dumps(flat))

    @classmethod
    def from_json(cls, data: dict) -> TrainConfig:
        """Flat (config.json of every run so far) or nested by section (`to_json(nested=True)`)."""
        flat, unknown = {}, []
        for key, value in data.items():
            if key in SECTIONS and isinstance(value, dict):
                names = {f.name: f.metadata["name"] for f in dataclasses.fields(SECTIONS[key])}
                for name, v in value.items():
                    if name in names:
                        flat[names[name]] = v
                    else:
                        unknown.append(f"{key}.{name}")
            elif key in FLAT:
                flat[key] = value
            else:
                unknown.append(key)
        if unknown:
            raise ConfigError(f"config: unknown fields {', '.join(sorted(unknown))}")
        return cls(**flat)

    def arch_signature(self) -> dict:
        """What must match for a checkpoint to load into this model."""
        keys = [
            "model", "arch_sparse_feature_size", "arch_embedding_size", "arch_mlp_bot",
            "arch_mlp_top", "arch_interaction_op", "arch_interaction_itself", "optimizer",
        ]  # fmt: skip
        if self.arch_interaction_op == "dcn":  # only then: dot and cat checkpoints load as before
            keys += list(DCN_FIELDS)
        keys += model_kind(self.model).signature_fields
        out = {k: getattr(self, k) for k in keys}
        return json.loads(json.dumps(out))

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir)

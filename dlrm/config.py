"""Training configuration: one section per capability (dlrm/settings/), each field one flag.

    TrainConfig(mini_batch_size=256, optimizer="adagrad", out_dir="runs/a")   # flat names
    cfg.training.mini_batch_size, cfg.slipstreaming.mode                       # the sections
    cfg.mini_batch_size                                                        # flat reads too

A flat name is the flag without its dashes (`--numpy-rand-seed` is `seed`, `--dist-timeout` is
`dist_timeout_s`, `--slipstream` is `slipstream`); config.json holds the flat names, as it
always has, and `from_json` also reads the sections' nested form. What a run leaves unset its
recipe fills: a user's `--recipe FILE`, then the run's reference recipe (dlrm/recipes/*.toml).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from dlrm import recipes
from dlrm.errors import ConfigError
from dlrm.models.kinds import model_kind
from dlrm.placement.kinds import AUTO, placement_kind
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

# architecture fields of the cross layers: in the signature of a dcn model only
DCN_FIELDS = ("dcn_num_layers", "dcn_low_rank_dim")

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
# flat name -> flag, the vocabulary of recipe files
NAMES = {f.metadata["name"]: f.metadata["flag"] for f in SETTINGS}
assert not set(NAMES) & set(recipes.DECLARATIONS), "a setting named like a recipe declaration"

# The reference recipes, dlrm/recipes/*.toml: each run's defaults, filled where it was not given.
RECIPES = recipes.shipped(NAMES)
_MLPERF = next(r for r in RECIPES if r.shown.endswith("terabyte-dcn.toml")).settings
MLPERF_DCNV2_TABLES = tuple(_MLPERF["arch_embedding_size"])
MLPERF_DCNV2_MULTI_HOT = tuple(_MLPERF["multi_hot_sizes"])
# each reference run's training step by (model, data set), as its file sets it
REFERENCE_TRAINING: dict[tuple[str, str], dict] = {
    (model, data_set): {
        n: v for n, v in r.settings.items() if FLAT[n][0] == "training" and n not in r.unprinted
    }
    for r in RECIPES
    for model, data_set, interaction in r.default_for
    if interaction == recipes.ANY and recipes.ANY not in (model, data_set)
}


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


def _as_flags(settings: dict) -> str:
    """Settings spelled as the flags that give them: `--arch-mlp-bot 13-512 --optimizer sgd`."""
    shown = []
    for name, value in settings.items():
        if isinstance(value, tuple):
            text = "-".join(map(str, value))
        else:
            text = str(value).lower() if isinstance(value, bool) else str(value)
        shown.append(f"{NAMES[name]} {text}")
    return " ".join(shown)


def _in_recipe(error: ConfigError, path: str | None, from_file: dict) -> ConfigError:
    """A value's error ("--flag: expected ...") names the recipe file and key it came from."""
    for name in from_file:
        flag = NAMES[name]
        if str(error).startswith(flag + ":"):
            return ConfigError(f"--recipe {path}: {name}{str(error)[len(flag) :]}")
    return error


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
        `dataclasses.replace` passes them); a flat name wins over its section's value. A user's
        recipe (`recipe="my.toml"`) is as if its settings were given, under those given here;
        the run's reference recipe then fills what is still unset."""
        path = settings.get(recipes.RECIPE_SETTING)
        from_file: dict = {}
        if isinstance(path, str):  # anything else: the run section's type check names it
            recipe = recipes.read(path, NAMES, f"--recipe {path}")
            from_file = {k: v for k, v in recipe.settings.items() if k not in settings}
            settings = {**from_file, **settings}
        try:
            self._make(settings)
            self.reference_defaults = self._fill_from_recipe()
            self.check()
        except ConfigError as e:
            raise _in_recipe(e, path, from_file) from None
        self.recipe_settings = {name: getattr(self, name) for name in from_file}

    def _make(self, settings: dict) -> None:
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
        # config.json or of the user's recipe), whatever the value: `--hot-budget 256MB` is given
        # though it is the default. None is "not given" (the settings' own meaning: filled from
        # a recipe).
        self.given = frozenset(k for k, v in settings.items() if k in FLAT and v is not None)

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

    def _fill_from_recipe(self) -> dict:
        """Settings still unset (None) take the values of the run's reference recipes
        (dlrm/recipes/), the most specific first; returns those named at start, in order."""
        run = (self.model, self.data_set, self.arch_interaction_op)
        chain = recipes.defaults_for(RECIPES, run, lambda name: name in self.given)
        fill: dict = {}
        printed: list[str] = []
        self.default_recipes = []  # the files the printed values came from
        for recipe in chain:
            mine = {
                n: v
                for n, v in recipe.settings.items()
                if n not in fill and getattr(self, n) is None
            }
            fill.update(mine)
            shown = [n for n in mine if n not in recipe.unprinted]
            printed += shown
            if shown:
                self.default_recipes.append(recipe.shown)
        by_section: dict[str, dict] = {}
        for name, value in fill.items():
            attr, field = FLAT[name]
            by_section.setdefault(attr, {})[field] = value
        for attr, values in by_section.items():  # replaced, so each value is parsed and checked
            object.__setattr__(self, attr, dataclasses.replace(getattr(self, attr), **values))
        return {n: getattr(self, n) for n in printed}

    def describe_reference_defaults(self) -> str:
        """One line: the reference settings this run took for fields it was not given."""
        if not self.reference_defaults:
            return ""
        shown = _as_flags(self.reference_defaults)
        return f"{self.model} on {self.data_set}: reference settings {shown}"

    def describe_recipes(self) -> list[str]:
        """The start lines: what the user's recipe set (the flags given won over the rest), and
        what the reference recipe filled, naming its file."""
        lines = []
        if self.recipe_settings:
            lines.append(f"recipe {self.run.recipe}: {_as_flags(self.recipe_settings)}")
        if self.reference_defaults:
            files = ", ".join(self.default_recipes)
            lines.append(f"{self.describe_reference_defaults()} ({files})")
        return lines

    def check(self) -> None:
        """The rules between sections (each section checked its own when it was made), and the
        training section's again now that the recipe filled what it was not given."""
        self.training.check()
        if self.slipstream and self.hotline_learn_batches:
            raise ConfigError(
                "--slipstream: tracks the plan's hot rows, which --hotline-learn-batches only "
                "knows after training has begun; plan from a profile instead"
            )
        if self.placement != AUTO:  # the kind's rules on its settings and other sections
            placement_kind(self.placement).check(self)

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
        # a saved config holds every value its recipe set: the file is not read again (it may
        # have moved or changed since), only recorded
        path = flat.pop(recipes.RECIPE_SETTING, None)
        cfg = cls(**flat)
        if path is not None:
            object.__setattr__(cfg, "run", dataclasses.replace(cfg.run, recipe=path))
            cfg.given = cfg.given | {recipes.RECIPE_SETTING}
        return cfg

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

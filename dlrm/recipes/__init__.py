"""Recipes: a run's settings as a small TOML file, one key per setting by its flat name (the
flag without its dashes), as nanoGPT keeps its config/ files. Data, never code: read with
tomllib, never executed.

The files in this folder are the reference recipes. Each declares which runs it is the default
for; a run takes, for the settings it was not given, the most specific file that matches it,
then the less specific ones for what that one left unset:

    source        where the values come from
    default_for   [{ model = ..., data_set = ..., interaction = ... }, ...]; "*" matches any
    unless_given  settings whose presence makes it not apply (the next most specific one does)
    unprinted     settings it fills without naming them in the run's start line

A user's recipe (`python -m dlrm.train --recipe FILE`) has the same format; its declarations
are ignored, so a copy of any file here is a recipe of one's own. No torch here (--help).
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlrm.errors import ConfigError

HERE = Path(__file__).resolve().parent
ANY = "*"
RUN = ("model", "data_set", "interaction")  # what default_for matches, in this order
DECLARATIONS = ("source", "default_for", "unless_given", "unprinted")
# the setting that names a recipe: a recipe naming another would make the order of files a rule
RECIPE_SETTING = "recipe"


@dataclass(frozen=True)
class Recipe:
    shown: str  # the file as errors and the start line name it
    settings: dict[str, Any]  # flat name -> the value as written (the sections parse it)
    source: str = ""
    default_for: tuple[tuple[str, str, str], ...] = ()
    unless_given: tuple[str, ...] = ()
    unprinted: tuple[str, ...] = ()


def read(path: str | Path, names: Mapping[str, str], label: str | None = None) -> Recipe:
    """One recipe file; any mistake in it is one ConfigError starting with `label` (default:
    the path). `names`: every setting's flat name -> its flag."""
    label = label or str(path)
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{label}: no such file") from None
    except OSError as e:
        raise ConfigError(f"{label}: cannot read it ({e.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{label}: not UTF-8 text (a recipe is a TOML file)") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{label}: not valid TOML ({e})") from None
    settings = {k: v for k, v in doc.items() if k not in DECLARATIONS}
    for key in settings:
        if key == RECIPE_SETTING:
            raise ConfigError(f"{label}: {key}: a recipe cannot name another recipe")
        if key not in names:
            raise ConfigError(f"{label}: no setting named {key!r}{_hint(key, names)}")
    source = doc.get("source", "")
    if not isinstance(source, str):
        raise ConfigError(f"{label}: source: expected a string, got {source!r}")
    return Recipe(
        shown=label,
        settings=settings,
        source=source,
        default_for=_runs(doc.get("default_for", []), label),
        unless_given=_names(doc, "unless_given", names, label),
        unprinted=_names(doc, "unprinted", settings, label),
    )


def _hint(key: str, names: Mapping[str, str]) -> str:
    by_flag = {flag.lstrip("-").replace("-", "_"): name for name, flag in names.items()}
    if key.replace("-", "_") in by_flag:
        return f" (its name is {by_flag[key.replace('-', '_')]})"
    return " (keys are settings' flat names: a flag without its dashes, e.g. mini_batch_size)"


def _runs(value: Any, label: str) -> tuple[tuple[str, str, str], ...]:
    def ok(d: Any) -> bool:
        return (
            isinstance(d, dict)
            and set(d) == set(RUN)
            and all(isinstance(v, str) for v in d.values())
        )

    if not isinstance(value, list) or not all(ok(d) for d in value):
        raise ConfigError(
            f"{label}: default_for: expected a list of tables like "
            f'{{ model = "dlrm", data_set = "kaggle", interaction = "*" }}, got {value!r}'
        )
    return tuple(tuple(d[k] for k in RUN) for d in value)


def _names(doc: dict, key: str, allowed: Mapping[str, Any], label: str) -> tuple[str, ...]:
    value = doc.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{label}: {key}: expected a list of setting names, got {value!r}")
    unknown = [v for v in value if v not in allowed]
    if unknown:
        raise ConfigError(f"{label}: {key}: {unknown[0]!r} is not a setting this file sets")
    return tuple(value)


def shipped(names: Mapping[str, str]) -> list[Recipe]:
    """The reference recipes in this folder; two claiming the same runs is an error."""
    root = HERE.parent.parent
    found = [read(p, names, str(p.relative_to(root))) for p in sorted(HERE.glob("*.toml"))]
    claimed: dict[tuple[str, str, str], str] = {}
    for recipe in found:
        for run in recipe.default_for:
            if run in claimed:
                raise ConfigError(
                    f"{recipe.shown}: default_for {run} is already {claimed[run]}'s; one file per run"
                )
            claimed[run] = recipe.shown
    return found


def defaults_for(
    recipes: list[Recipe], run: tuple[str, str, str], is_set: Callable[[str], bool]
) -> list[Recipe]:
    """The recipes a run (model, data set, interaction) takes, most specific (fewest "*") first:
    the files declaring themselves its default and not set aside by a setting in their
    `unless_given`. Each fills what the ones before it left unset; two equally specific would
    make that order a guess, so they are an error."""
    found: dict[str, tuple[int, Recipe]] = {}  # file -> (its most specific match, recipe)
    for recipe in recipes:
        if any(is_set(name) for name in recipe.unless_given):
            continue
        scores = [
            sum(want != ANY for want in declared)
            for declared in recipe.default_for
            if all(want in (ANY, got) for want, got in zip(declared, run))
        ]
        if scores:
            found[recipe.shown] = (max(scores), recipe)
    if not found:
        raise ConfigError(f"no recipe in {HERE} is the default for {' '.join(run)}")
    order = sorted(found, key=lambda shown: -found[shown][0])
    for a, b in zip(order, order[1:]):
        if found[a][0] == found[b][0]:
            tied = ", ".join(sorted((a, b)))
            raise ConfigError(f"recipes {tied} are equally the default for {' '.join(run)}")
    return [found[shown][1] for shown in order]

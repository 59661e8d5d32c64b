"""Step hooks that packages above `dlrm` provide for a setting of the run, registered by them.

`dlrm` never imports the packages built on it (the layer order common <- data_pipeline <-
embeddings <- dlrm <- {serving, perfmodel, scripts}, tests/test_layers.py), yet `python -m
dlrm.train --perf-log DIR` attaches the performance model's recorder. The recorder's module
registers itself here when it is imported:

    step_hooks.register("perf_log", StepRecorder)       # perfmodel/recorder.py

and `python -m dlrm.train` imports the plugin modules before it builds the trainer
(`load_plugins`): those of the `hybrid_dlrm.plugins` entry-point group of the installed
distribution (pyproject.toml lists perfmodel's), and any named, comma-separated, in the
environment variable HYBRID_DLRM_PLUGINS (a checkout that is not installed, another tool's hook).
A library user passes `Trainer(cfg, step_hook=...)` and needs none of this.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from collections.abc import Callable
from typing import Any

from dlrm.errors import ConfigError
from dlrm.pipelines.base import StepHook

GROUP = "hybrid_dlrm.plugins"
ENVIRONMENT = "HYBRID_DLRM_PLUGINS"

# setting name (a TrainConfig field) -> the factory of its hook, called with the setting's value
_FACTORIES: dict[str, Callable[[Any], StepHook]] = {}


def register(setting: str, factory: Callable[[Any], StepHook]) -> None:
    _FACTORIES[setting] = factory


def plugin_modules() -> list:
    """Every plugin module, imported (each registers the hooks it provides, and may name other
    things it provides as attributes: the planner's step costs, dlrm/placement/candidates.py)."""
    names = [ep.value for ep in importlib.metadata.entry_points(group=GROUP)]
    names += [n.strip() for n in os.environ.get(ENVIRONMENT, "").split(",") if n.strip()]
    return [importlib.import_module(name.split(":")[0]) for name in dict.fromkeys(names)]


def load_plugins() -> None:
    """Import every plugin module (each registers what it provides)."""
    plugin_modules()


def hook_for(run: Any, settings: tuple[str, ...] = ("perf_log",)) -> StepHook | None:
    """The hook of the first of `settings` that the run section (`RunConfig`) sets; ConfigError
    when no plugin provides it."""
    for setting in settings:
        value = getattr(run, setting, None)
        if not value:
            continue
        if setting not in _FACTORIES:
            flag = "--" + setting.replace("_", "-")
            raise ConfigError(
                f"{flag}: no installed plugin provides it (the performance model registers it "
                f"through the {GROUP!r} entry point: reinstall with `pip install -e .`, or set "
                f"{ENVIRONMENT} to the module that registers it)"
            )
        return _FACTORIES[setting](value)
    return None

"""`--perf-log` reaches the trainer from perfmodel's side: perfmodel.recorder registers its
recorder with dlrm/pipelines/step_hooks.py, and `python -m dlrm.train` imports the plugin modules that the
installed distribution's entry points (pyproject.toml) or HYBRID_DLRM_PLUGINS name."""

import importlib.metadata
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

from dlrm.errors import ConfigError
from dlrm.pipelines import step_hooks

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_declares_the_recorder_as_a_plugin():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"][step_hooks.GROUP] == {"perfmodel": "perfmodel.recorder"}


def test_importing_the_recorder_registers_the_perf_log_hook(tmp_path):
    from perfmodel.recorder import StepRecorder

    hook = step_hooks.hook_for(SimpleNamespace(perf_log=str(tmp_path)))
    assert isinstance(hook, StepRecorder) and hook.out_dir == tmp_path
    assert step_hooks.hook_for(SimpleNamespace(perf_log=None)) is None


def test_plugins_come_from_entry_points_and_the_environment(monkeypatch):
    imported = []
    monkeypatch.setattr(step_hooks.importlib, "import_module", imported.append)
    point = importlib.metadata.EntryPoint("perfmodel", "perfmodel.recorder", step_hooks.GROUP)
    monkeypatch.setattr(step_hooks.importlib.metadata, "entry_points", lambda group: [point])
    monkeypatch.setenv(step_hooks.ENVIRONMENT, " other.plugin ,perfmodel.recorder")
    step_hooks.load_plugins()
    assert imported == ["perfmodel.recorder", "other.plugin"]


def test_a_setting_no_plugin_provides_is_one_line(monkeypatch):
    monkeypatch.setattr(step_hooks, "_FACTORIES", {})
    with pytest.raises(ConfigError, match=r"^--perf-log: no installed plugin provides it"):
        step_hooks.hook_for(SimpleNamespace(perf_log="x"))

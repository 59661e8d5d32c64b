"""Checks a run makes before any long work: where it will write, and whether `--resume`
continues the same run.

A mistake found here costs seconds; found after preprocessing and an epoch it costs the epoch.

A resumed run is the same run: settings that change what is computed (seed, data, learning rate
and its policy, batch sizes, test set, placement, precision, ...) must equal the checkpoint's,
or `--resume` would silently train the rest of the run on something else. A user who means it
says so (`--allow-changed lr,test-data-size`), and the change is recorded in config.json and
metrics.jsonl. Settings in FREE only say how the run is watched, stored or ended.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import replace
from pathlib import Path

from dlrm.checkpoints import format as ckpt
from dlrm.checkpoints.format import MODEL_FILE
from dlrm.config import DCN_FIELDS, FLAT, SETTINGS, TrainConfig
from dlrm.errors import ConfigError
from dlrm.run_layout import RUN_DIRECTORY, run_files
from embeddings.plan import PLAN_FILES
from embeddings.profile import PROFILE_FILE
from embeddings.room import fmt_bytes
from hybrid_dlrm.common.outputs import Purpose, check_output, check_pair

log = logging.getLogger(__name__)

# Settings that do not change a single computed number of the steps both runs take: the ones
# whose field says `free` (dlrm/settings/).
FREE = frozenset(f.metadata["name"] for f in SETTINGS if f.metadata["free"])
FLAGS = {f.metadata["name"]: f.metadata["flag"] for f in SETTINGS}
# what --allow-changed also understands: "lr", and every flag's own spelling (--numpy-rand-seed)
ALIASES = {"lr": "learning_rate"} | {
    flag.lstrip("-").replace("-", "_"): f.metadata["name"]
    for f in SETTINGS
    for flag in (f.metadata["flag"], *f.metadata["aliases"])
}


def allowed_changes(cfg: TrainConfig) -> set[str]:
    out = set()
    for name in cfg.run.allow_changed:
        name = ALIASES.get(name, name)
        if name not in FLAT:
            raise ConfigError(f"--allow-changed: no setting named {name!r}")
        out.add(name)
    return out


def changed_settings(before: dict, cfg: TrainConfig) -> dict[str, tuple]:
    """{setting: (before, now)} for the settings that change the computation (the model's
    architecture is the checkpoint's own check: no flag allows another model)."""
    # DCN's fields are architecture too, whichever interaction this run has: a dcn checkpoint
    # resumed as a dot model is the checkpoint's "different model", not an allowed change
    now, arch = cfg.to_json(), {*cfg.arch_signature(), *DCN_FIELDS}
    return {
        k: (before.get(k), v)
        for k, v in now.items()
        if k not in FREE and k not in arch and k in before and before[k] != v
    }


# the data's shape: the checkpoint's tables were trained on these bags, and a resumed run's
# batches must be the uninterrupted run's; no flag allows changing them
DATA_SHAPE = ("multi_hot_sizes", "multi_hot_distribution")


def check_resume_settings(before: dict, cfg: TrainConfig, source: str) -> dict[str, tuple]:
    """The changes `--allow-changed` allows; any other change is a ConfigError naming them."""
    changes = changed_settings(before, cfg)
    shape = [k for k in DATA_SHAPE if k in changes]
    if shape:
        shown = ", ".join(f"{FLAGS[k]} {changes[k][0]!r} -> {changes[k][1]!r}" for k in shape)
        raise ConfigError(
            f"--resume: {source} was trained on other bags ({shown}); the data's shape cannot "
            "change within a run: start a new one"
        )
    refused = sorted(set(changes) - allowed_changes(cfg))
    if refused:
        shown = ", ".join(f"{FLAGS[k]} {changes[k][0]!r} -> {changes[k][1]!r}" for k in refused)
        raise ConfigError(
            f"--resume: {source} was trained with other settings ({shown}); resume with the "
            f"same ones, or pass --allow-changed {','.join(k.replace('_', '-') for k in refused)}"
        )
    return changes


def resume_source_dir(cfg: TrainConfig) -> Path | None:
    """The run directory `--resume` continues (for a checkpoint file, the run holding it; None
    for a file outside a run's checkpoints/ directory)."""
    if cfg.run.resume == "auto":
        return cfg.run_dir
    source = Path(cfg.run.resume)
    if source.is_dir():
        return source
    return source.parent.parent if source.parent.name == "checkpoints" else None


def holds_a_run(run: Path) -> bool:
    """Finished, or with a checkpoint (a run stopped before its first one holds nothing)."""
    return (run / "summary.json").exists() or bool(ckpt.list_checkpoints(run / "checkpoints"))


def check_run_dir_is_free(cfg: TrainConfig) -> None:
    """A new run never writes into an earlier run's directory: its metrics and checkpoints
    would be mixed with (or pruned among) the old ones. A run that was stopped before it
    finished its first checkpoint is the exception: there is nothing in it to continue or to
    lose but its log, and a user rerunning the same command expects it to start again (its
    metrics.jsonl keeps the stopped attempt's events, as a resumed run's keeps those past its
    checkpoint)."""
    run = cfg.run_dir
    if cfg.run.resume or not run.is_dir():
        return
    if holds_a_run(run):
        raise ConfigError(
            f"--out-dir: {run} already holds a run; pass --resume to continue it or choose another --out-dir"
        )
    if (run / "metrics.jsonl").exists():
        log.warning(
            "--out-dir: %s holds a run stopped before its first checkpoint; starting it again", run
        )


def check_resume_target(cfg: TrainConfig) -> None:
    """`--resume A --out-dir B` continues A's run in B: B must not hold another run."""
    source = resume_source_dir(cfg)
    run = cfg.run_dir
    if source is None:  # a loose file: what it is gets checked when it is loaded
        return
    if source.resolve() != run.resolve() and run.is_dir() and holds_a_run(run):
        raise ConfigError(
            f"--out-dir: {run} already holds another run; resuming {cfg.run.resume} there would "
            "overwrite it: choose an empty --out-dir, or leave --out-dir out to continue in "
            f"{source}"
        )


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


PERF_LOG_DIRECTORY = Purpose(
    "perf trace directory", directory=True,
    identify=lambda d: any(d.glob("trace-rank*.trace.json")),
)  # fmt: skip


def run_inputs(cfg: TrainConfig) -> dict[str, Path]:
    """What the run reads: its data, the model it starts from, the run it resumes (the
    checkpoint file, or that run's files). Never written by any output flag."""
    data, run = cfg.data, cfg.run
    given = {
        "--raw-data-file": data.raw_data_file,
        "--processed-data-file": data.processed_data_file,
        "--load-model": run.load_model,
    }
    inputs = {label: Path(p) for label, p in given.items() if p}
    if run.resume:
        source = Path(run.resume) if run.resume != "auto" else cfg.run_dir
        if source.is_dir():
            inputs |= run_files(source, "--resume's")
        else:
            inputs["--resume"] = source
    return inputs


def check_write_paths(cfg: TrainConfig) -> None:
    """Every output flag of the run against the output rule (hybrid_dlrm/common/outputs.py):
    --out-dir, --save-model, --perf-log, and --profile-file / --placement-plan (read when they
    exist, else written after profiling)."""
    inputs = run_inputs(cfg)
    protected = {**inputs, **run_files(cfg.run_dir)}
    over = cfg.run.overwrite

    def check(path, flag: str, purpose: Purpose, guard: dict[str, Path] = protected) -> Path:
        return check_output(path, flag, purpose, protected=guard, overwrite=over, error=ConfigError)

    check(cfg.run_dir, "--out-dir", RUN_DIRECTORY, inputs)
    if cfg.run.save_model:
        check(cfg.run.save_model, "--save-model", MODEL_FILE)
    if cfg.placing.profile_file:
        check(cfg.placing.profile_file, "--profile-file", replace(PROFILE_FILE, reused=True))
    if cfg.placing.placement_plan:
        check_pair(cfg.placing.placement_plan, "--placement-plan", PLAN_FILES, protected=protected,
                   overwrite=over, error=ConfigError)  # fmt: skip
    if cfg.run.perf_log:
        check(cfg.run.perf_log, "--perf-log", PERF_LOG_DIRECTORY)


def read_run_settings(run: Path, warn: bool = True) -> dict | None:
    """The settings in a run directory's config.json; None when there is none, or when it is
    damaged (then, with `warn`, one warning: the checkpoint carries its run's settings too,
    verified by its checksums, so those are checked instead, and config.json is written again)."""
    path = run / "config.json"
    if not path.is_file():
        return None
    try:
        settings = json.loads(path.read_bytes())
    except (ValueError, OSError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        settings = None
    if isinstance(settings, dict):
        return settings
    if warn:
        log.warning(
            "%s: damaged (not a JSON object of settings); the checkpoint's own settings are "
            "checked instead, and it is written again",
            path,
        )
    return None


def check_free_space(path: Path, needed: int, what: str, flag: str = "--out-dir") -> None:
    """At least `needed` bytes free where `path` will be."""
    free = shutil.disk_usage(_nearest_existing(path)).free
    if free < needed:
        raise ConfigError(
            f"{flag}: {fmt_bytes(free)} free where {path} is, but {what} takes about "
            f"{fmt_bytes(needed)}"
        )

"""`python -m dlrm.train`: the command line of facebookresearch/dlrm, on this framework.

With no arguments it trains the Kaggle-shaped architecture on the embedded synthetic data set
and prints the test AUC and throughput. Flags keep the reference's names and meaning where the
feature is supported; booleans are real booleans (`--inference-only`, `--inference-only=false`).
A user's mistake ends the run with one line naming the flag or file, exit code 2.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from data_pipeline.errors import DataError
from dlrm.config import SECTIONS, TrainConfig
from dlrm.errors import CheckpointError, ConfigError, TrainingDiverged
from dlrm.flags import EXIT_USAGE, OneLineParser, add_settings
from dlrm.processes import thread_watch, threads
from embeddings.errors import ScmError
from hybrid_dlrm.common import cli_lines, endings, quick, ranks

__all__ = ["EXIT_USAGE", "OneLineParser", "build_parser", "config_from_args", "main"]


def build_parser() -> argparse.ArgumentParser:
    """Every setting's flag, generated from the settings' metadata (dlrm/flags.py)."""
    p = OneLineParser(prog="python -m dlrm.train", description=__doc__.splitlines()[0])
    add_settings(p, SECTIONS)
    return p


def config_from_args(argv: list[str] | None = None) -> TrainConfig:
    args = vars(build_parser().parse_args(argv))
    cfg = TrainConfig(**args)
    if quick.active():  # the docs' walk: a few steps of each run (hybrid_dlrm/common/quick.py)
        t, data, hotline, arch = cfg.training, cfg.data, cfg.hotline, cfg.arch
        arch.embedding_size = quick.cap_sizes("--arch-embedding-size", arch.embedding_size)
        data.synthetic_table_scale = quick.cap_scale(
            "--synthetic-table-scale", data.synthetic_table_scale
        )
        t.nepochs = quick.cap("--nepochs", t.nepochs)
        t.num_batches = quick.cap("--num-batches", t.num_batches)
        if t.mini_batch_size:
            t.mini_batch_size = quick.cap("--mini-batch-size", t.mini_batch_size)
        data.test_data_size = quick.cap("--test-data-size", data.test_data_size)
        if (data.max_ind_range or 0) > 0:  # hash mode: every table has this many rows
            data.max_ind_range = quick.cap("--max-ind-range", data.max_ind_range)
        if hotline.learn_batches:
            hotline.learn_batches = quick.cap("--hotline-learn-batches", hotline.learn_batches)
    return cfg


def main(argv: list[str] | None = None) -> int:
    """Ctrl-C or SIGTERM anywhere, also while an error is being reported or the process group
    is left, ends in this process's one line (`_interrupted_line`) and 130 or 143
    (hybrid_dlrm/common/endings.py)."""
    cli_lines.log_to_stderr("python -m dlrm.train")  # warnings as `{prog}: warning: ...`
    run = _Run()
    return endings.guarded(lambda: _main(argv, run), lambda how: _interrupted_line(run, argv, how))


class _Run:
    """What the interrupted line needs of a run, as far as it got."""

    cfg: TrainConfig | None = None
    rank: int = 0
    trainer = None


def _main(argv: list[str] | None, run: _Run) -> int:
    rank, world, finished = 0, 1, False
    try:
        # first: the load before the imports, which the thread count's first reading spans
        start = thread_watch.CpuSampler().read()
        cfg = run.cfg = config_from_args(argv)
        choice = threads.choose(cfg.training.threads, wait=threads.wait_policy())
        from dlrm.pipelines import step_hooks
        from dlrm.pipelines.base import StepHooks
        from dlrm.processes import distributed
        from dlrm.trainer import Trainer  # after parsing: --help and flag errors stay fast

        watch = None
        if choice.follows_load:
            watch = thread_watch.ThreadWatch(
                choice.threads, start=start, announce=thread_watch.announce if _leads() else None
            )
            line = choice.describe(now=watch.first(), others=watch.others)
        else:
            threads.apply(choice.threads)
            line = choice.describe()
        if _leads():
            print(line, flush=True)
        for recipe_line in cfg.describe_recipes() if _leads() else []:
            print(recipe_line, flush=True)
        quick.announce("python -m dlrm.train", None if _leads() else open(os.devnull, "w"))
        if distributed.launched_by_torchrun():
            rank, world = distributed.init_from_env(cfg)
            run.rank = rank
            cfg = run.cfg = distributed.first_attempt_resume(cfg)
        step_hooks.load_plugins()
        hook = StepHooks.of(watch, step_hooks.hook_for(cfg.run))
        trainer = run.trainer = Trainer(cfg, rank, world, step_hook=hook)
        summary = trainer.fit()
        finished = True
    except (ConfigError, DataError, CheckpointError, ScmError) as e:
        # before the process group starts every rank of a launcher finds the same mistake: the
        # first to fail says it (hybrid_dlrm/common/ranks.py); after it, each its own
        if world > 1 or ranks.first_to_fail():
            sys.stderr.write(f"python -m dlrm.train: error: {_ranked(e, rank, world)}\n")
        return EXIT_USAGE
    except TrainingDiverged as e:
        sys.stderr.write(f"python -m dlrm.train: training stopped: {_ranked(e, rank, world)}\n")
        return 1
    except Exception as e:
        if world == 1 or not distributed.is_communication_failure(e):
            raise
        stopped = endings.interruption()  # the others left on the same signal: not lost contact
        if stopped is not None:
            raise stopped from None
        sys.stderr.write(f"python -m dlrm.train: error: {distributed.failure_message(e, rank)}\n")
        return 1
    finally:
        if world > 1:
            distributed.shutdown(finished)
    if rank == 0 and trainer.finished_summary is None:  # else it said "nothing to do"
        _print_summary(cfg, summary)
    return 0


def _leads() -> bool:
    """Rank 0, or no torchrun: the process that prints the header and the summary (torchrun's
    RANK is read before the process group starts, so the header prints once too)."""
    return os.environ.get("RANK", "0") == "0"


def _interrupted_line(run: _Run, argv: list[str] | None, how: str) -> str:
    """Ctrl-C's (or SIGTERM's) one line for this process. One process: `_interrupted`. Under
    torchrun every rank was told (the terminal's Ctrl-C reaches the process group; torchrun's
    agent passes SIGTERM on), so each says what happened to it, and rank 0 also where the run
    can resume: `rank 1: interrupted at step 40`, never a lost contact it did not suffer."""
    cfg, trainer = run.cfg, run.trainer
    if cfg is None:  # still parsing: nothing started, nothing to say but what ended it
        return how if _leads() else ""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:  # not under torchrun
        return _interrupted(cfg, argv, how)
    step = trainer.state.step if trainer is not None else None
    where = f" at step {step}" if step is not None else " before training"
    rank = int(os.environ.get("RANK", run.rank))
    if rank != 0:
        return f"rank {rank}: {how}{where}"
    return _interrupted(cfg, argv, f"rank 0: {how}{where}", torchrun=True)


def _interrupted(
    cfg: TrainConfig, argv: list[str] | None, how: str = "interrupted", torchrun: bool = False
) -> str:
    """Ctrl-C's one line: where the last complete checkpoint is and the command that resumes.
    A checkpoint being written when the signal came is not it: the atomic write removed its
    temporary (hybrid_dlrm/common/atomic.py), so the newest complete file is the last good one.
    Under torchrun the command is torchrun's (its own flags are not visible to a rank: those
    it can know, the process counts, are spelled out; the rendezvous is the user's as before)."""
    from dlrm.checkpoints import format as ckpt

    run = Path(cfg.run.out_dir)
    found = ckpt.list_checkpoints(run / "checkpoints")
    if not found:
        return f"{how} before the first checkpoint; nothing to resume in {run}"
    args = _without_out_dir(list(sys.argv[1:] if argv is None else argv))
    launcher = _torchrun_launcher() if torchrun else ["python"]
    command = shlex.join([*launcher, "-m", "dlrm.train", *args, "--out-dir", str(run), "--resume"])
    return f"{how}; the last checkpoint is {found[-1]}; resume with: {command}"


def _torchrun_launcher() -> list[str]:
    """`torchrun --nnodes N --nproc_per_node P` as far as a rank can see it (WORLD_SIZE and
    LOCAL_WORLD_SIZE); the rendezvous flags of a several-machine run are the user's own. The
    launcher is the one that started the ranks: `python -m dlrm.torchrun` says so (dlrm/torchrun.py)."""
    from dlrm import torchrun

    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    nodes = max(1, world // max(local, 1))
    launcher = os.environ.get(torchrun.LAUNCHER_ENV)
    out = shlex.split(launcher) if launcher == torchrun.LAUNCHER else ["torchrun"]
    if nodes > 1:
        out += ["--nnodes", str(nodes), "RENDEZVOUS-FLAGS"]
    else:
        out += ["--standalone"]
    return [*out, "--nproc_per_node", str(local)]


def _without_out_dir(args: list[str]) -> list[str]:
    """`args` less `--out-dir X` and `--resume [X]`, which the resume command sets itself."""
    out, skip = [], False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a.startswith(("--out-dir=", "--resume=")):
            continue
        if a == "--out-dir":
            skip = True
            continue
        if a == "--resume":
            skip = i + 1 < len(args) and not args[i + 1].startswith("--")
            continue
        out.append(a)
    return out


def _ranked(e: Exception, rank: int, world: int) -> str:
    return f"rank {rank}: {e}" if world > 1 and not str(e).startswith("rank ") else str(e)


def _print_summary(cfg: TrainConfig, s: dict) -> None:
    from dlrm.summary_text import summary_lines

    print("\n".join(summary_lines(s, cfg.run.out_dir)), flush=True)


if __name__ == "__main__":
    code = main()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # a rank under torchrun
        endings.leave(code)  # not through the interpreter's teardown (endings.py says why)
    sys.exit(code)

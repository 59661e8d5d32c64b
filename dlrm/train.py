"""`python -m dlrm.train`: the command line of facebookresearch/dlrm, on this framework.

With no arguments it trains the Kaggle-shaped architecture on the embedded synthetic data set
and prints the test AUC and throughput. Flags keep the reference's names and meaning where the
feature is supported; booleans are real booleans (`--inference-only`, `--inference-only=false`).
A user's mistake ends the run with one line naming the flag or file, exit code 2.
"""

from __future__ import annotations

import argparse
import logging
import sys

from data_pipeline.errors import DataError
from dlrm.config import SECTIONS, TrainConfig
from dlrm.errors import CheckpointError, ConfigError, TrainingDiverged
from dlrm.flags import EXIT_USAGE, OneLineParser, add_settings
from embeddings.errors import ScmError

__all__ = ["EXIT_USAGE", "OneLineParser", "build_parser", "config_from_args", "main"]


def build_parser() -> argparse.ArgumentParser:
    """Every setting's flag, generated from the settings' metadata (dlrm/flags.py)."""
    p = OneLineParser(prog="python -m dlrm.train", description=__doc__.splitlines()[0])
    add_settings(p, SECTIONS)
    return p


def config_from_args(argv: list[str] | None = None) -> TrainConfig:
    args = vars(build_parser().parse_args(argv))
    return TrainConfig(**args)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # torchrec's KeyedJaggedTensor trips a torch.fx deprecation notice on first use; it is not
    # ours to fix and would be the first line a user sees.
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
    rank, world, finished = 0, 1, False
    try:
        cfg = config_from_args(argv)
        if cfg.reference_defaults:
            print(cfg.describe_reference_defaults(), flush=True)
        from dlrm import distributed, step_hooks
        from dlrm.trainer import Trainer  # after parsing: --help and flag errors stay fast

        if distributed.launched_by_torchrun():
            rank, world = distributed.init_from_env(cfg)
            cfg = distributed.first_attempt_resume(cfg)
        step_hooks.load_plugins()
        trainer = Trainer(cfg, rank, world, step_hook=step_hooks.hook_for(cfg))
        summary = trainer.fit()
        finished = True
    except (ConfigError, DataError, CheckpointError, ScmError) as e:
        sys.stderr.write(f"python -m dlrm.train: error: {_ranked(e, rank, world)}\n")
        return EXIT_USAGE
    except TrainingDiverged as e:
        sys.stderr.write(f"python -m dlrm.train: training stopped: {_ranked(e, rank, world)}\n")
        return 1
    except Exception as e:
        if world == 1 or not distributed.is_communication_failure(e):
            raise
        sys.stderr.write(f"python -m dlrm.train: error: {distributed.failure_message(e, rank)}\n")
        return 1
    finally:
        if world > 1:
            distributed.shutdown(finished)
    if rank == 0 and trainer.finished_summary is None:  # else it said "nothing to do"
        _print_summary(cfg, summary)
    return 0


def _ranked(e: Exception, rank: int, world: int) -> str:
    return f"rank {rank}: {e}" if world > 1 and not str(e).startswith("rank ") else str(e)


def _print_summary(cfg: TrainConfig, s: dict) -> None:
    def fmt(x) -> str:
        return "n/a" if x is None else f"{x:.4f}"

    print(
        f"test AUC {fmt(s['test_auc'])}  logloss {fmt(s['test_logloss'])}  "
        f"accuracy {fmt(s['test_accuracy'])}  NE {fmt(s['test_ne'])}"
    )
    print(
        f"trained {s['samples']} samples in {s['steps']} steps, {s['wall_s']:.1f} s: "
        f"{s['train_samples_per_s']:.0f} samples/s ({cfg.precision}, {s['device']})"
    )
    print(f"run directory: {cfg.out_dir}")


if __name__ == "__main__":
    sys.exit(main())

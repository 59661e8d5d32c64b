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
from dlrm.config import TrainConfig
from dlrm.errors import CheckpointError, ConfigError, TrainingDiverged
from embeddings.errors import ScmError

EXIT_USAGE = 2

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _bool_or_auto(text: str) -> bool | None:
    return None if text.strip().lower() == "auto" else _bool(text)


class OneLineParser(argparse.ArgumentParser):
    """argparse with a flag mistake as one line and exit code 2 (the dlrm CLIs' parser)."""

    def error(self, message: str) -> None:  # one line, not the usage block
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    d = TrainConfig.__dataclass_fields__
    p = OneLineParser(prog="python -m dlrm.train", description=__doc__.splitlines()[0])

    def opt(flag: str, type_=str, dest: str | None = None, help_: str = "", **kw) -> None:
        dest = dest or flag.lstrip("-").replace("-", "_")
        p.add_argument(flag, type=type_, dest=dest, default=argparse.SUPPRESS, help=help_, **kw)

    def flag(name: str, help_: str) -> None:
        dest = name.lstrip("-").replace("-", "_")
        p.add_argument(
            name,
            type=_bool,
            nargs="?",
            const=True,
            dest=dest,
            default=argparse.SUPPRESS,
            help=help_,
        )

    opt("--model", help_="dlrm or tbsm")
    opt("--arch-sparse-feature-size", int, help_="embedding dimension")
    opt("--arch-embedding-size", help_="rows per table, dash-separated (default: the data set's)")
    opt("--arch-mlp-bot", help_="bottom MLP widths, input first, e.g. 13-512-256-64-16")
    opt("--arch-mlp-top", help_="top MLP widths after the interaction, ending in 1, e.g. 512-256-1")
    opt("--arch-interaction-op", help_="dot or cat")
    flag("--arch-interaction-itself", "include each feature's dot with itself")
    opt("--embedding-backend", help_="auto, fbgemm or torch")

    opt("--ts-length", int, help_="tbsm: history steps before the candidate (default 20)")
    opt("--model-type", help_="tbsm: tsl (default), mha or rnn")
    opt("--tsl-inner", help_="tbsm: dot, ind (A w) or def (A^T A w, default)")
    opt("--tsl-mechanism", help_="tbsm: mul or mlp (default)")
    opt("--tsl-num-heads", int, help_="tbsm: TSL components, each with its own MLP")
    opt("--tsl-mlp", help_="tbsm: attention MLP hidden widths, e.g. 15-15")
    opt(
        "--arch-mlp",
        help_="tbsm: final MLP widths after [context, candidate], ending in 1, e.g. 60-1",
    )
    flag("--tsl-proj", "tbsm: project history and candidate onto the unit sphere (default true)")
    opt("--mha-num-heads", int, help_="tbsm --model-type mha: attention heads")
    opt("--rnn-num-layers", int, help_="tbsm --model-type rnn: LSTM layers")
    opt("--points-per-user", int, help_="taobao: samples per user and split (each with a negative)")

    opt("--data-set", help_="synthetic (default), kaggle, terabyte or taobao")
    opt("--raw-data-file", help_="raw Criteo/Taobao input")
    opt("--processed-data-file", help_="preprocessed dataset directory (made on first use)")
    opt("--data-randomize", help_="none, day or total")
    opt("--max-ind-range", int, help_="hash categorical values modulo this many rows")
    opt("--data-sub-sample-rate", float, help_="drop this share of negative training samples")
    opt("--frequency-threshold", int, help_="values seen fewer times share one id")
    opt("--on-bad-line", help_="error (default) or skip malformed raw lines")
    opt("--data-size", int, help_="synthetic: training samples per epoch")
    opt("--test-data-size", int, help_="synthetic: test samples")
    opt("--synthetic-zipf", float, help_="synthetic: Zipf exponent of the row accesses")
    opt("--synthetic-table-scale", float, help_="synthetic: scale of the Kaggle table sizes")

    opt("--mini-batch-size", int)
    opt("--test-mini-batch-size", int)
    opt("--nepochs", int)
    opt("--num-batches", int, help_="batches per epoch (0: all)")
    opt("--learning-rate", float)
    opt("--optimizer", help_="sgd, adagrad or rowwise_adagrad (sparse part fused into backward)")
    opt("--loss-function", help_="bce or mse")
    opt("--lr-num-warmup-steps", int)
    opt("--lr-decay-start-step", int)
    opt("--lr-num-decay-steps", int)
    opt("--precision", help_="fp32 or bf16 (autocast of the dense part; embeddings stay fp32)")
    flag(
        "--flush-denormal",
        "CPU: treat denormal floats as zero (default true; a denormal operand "
        "makes oneDNN's bf16 matmuls several times slower)",
    )
    p.add_argument("--compile", type=_bool_or_auto, nargs="?", const=True, default=argparse.SUPPRESS,
                   help="compile the dense part with TorchInductor: true, false or auto (default: "
                        "bf16 only, where it pays; docs/speed.md)")  # fmt: skip
    opt("--device", help_="auto, cpu or cuda")
    opt("--numpy-rand-seed", int, dest="seed", help_="seed of initialisation and data order")
    opt("--seed", int, help_="alias of --numpy-rand-seed")

    opt(
        "--placement",
        help_="where embedding rows live: device (default), host, fae, hotline, tiered or auto",
    )
    opt(
        "--hot-budget",
        help_="device bytes for hot rows, weights + optimizer state (e.g. 256MB, 2GB)",
    )
    opt(
        "--profile-sample-rate",
        float,
        help_="share of the training batches to profile (default 0.05)",
    )
    opt("--profile-file", help_="access profile (.npz): reused when it exists, else written")
    opt(
        "--placement-plan",
        help_="placement plan (.npz + .json): reused when it exists, else written",
    )
    opt("--fae-switch-period", int, help_="fae: mini-batches per hot-then-cold window (default 64)")
    opt(
        "--fae-order",
        help_="fae: interleave (default) or block (all cold then all hot, an ablation)",
    )
    opt(
        "--hotline-prefetch",
        int,
        help_="hotline: mini-batches whose cold rows are staged ahead on a worker (default 1)",
    )
    opt(
        "--hotline-learn-batches",
        int,
        help_="hotline: learn row popularity over the first N mini-batches instead of a profile",
    )

    # Slipstream (docs/slipstream.md)
    flag("--slipstream", "skip the work of embedding rows that stopped changing (default off)")
    opt(
        "--slipstream-mode",
        help_="slipstream: drop (default: leave out all-stale inputs) or freeze",
    )
    opt("--slipstream-interval", int, help_="slipstream: steps between snapshots (default 50)")
    opt("--slipstream-metric", help_="slipstream: relative (default) or absolute L2 drift")
    opt("--slipstream-threshold", float, help_="slipstream: drift below which a row is stale")
    opt(
        "--slipstream-target-skip",
        float,
        help_="slipstream: without a threshold, the share of recent inputs to make skippable (0.2)",
    )
    opt("--slipstream-warmup", int, help_="slipstream: steps before anything is skipped (100)")
    opt("--slipstream-control", help_="slipstream: staleness (default) or random (the control)")
    flag("--slipstream-normalize", "slipstream: scale each feature's pooled embedding to unit norm")
    opt(
        "--slipstream-min-lookups",
        int,
        help_="slipstream: trained lookups per interval before a row may be called stale (8)",
    )
    # the SSD tier (--placement tiered): docs/scm.md
    opt("--scm-dir", help_="tiered: directory of the SSD tier's files (default: OUT_DIR/scm)")
    opt("--scm-cache", help_="tiered: DRAM row cache for the SSD tier's rows (e.g. 256MB)")
    opt("--scm-io", help_="tiered: direct (O_DIRECT, default) or buffered (through the page cache)")
    opt("--scm-io-threads", int, help_="tiered: I/O threads of the thread engine (default 16)")
    opt(
        "--scm-io-engine",
        help_="tiered: auto (Linux AIO with direct I/O where available), aio or threads",
    )
    opt("--scm-io-depth", int, help_="tiered: AIO requests in flight at once (default 64)")
    opt(
        "--embedding-init",
        help_="auto (default), uniform or hashed (rows a pure function of seed, table, row)",
    )

    # multi-process training: `torchrun --nproc_per_node N -m dlrm.train ...` (docs/distributed.md)
    opt("--dist-backend", help_="under torchrun: auto (nccl with CUDA, else gloo), gloo or nccl")
    opt(
        "--sharding",
        help_="under torchrun: how tables are split, auto, table_wise, column_wise, row_wise "
        "(nccl) or data_parallel",
    )
    opt("--sharding-min-columns", int, help_="narrowest column-wise shard (default torchrec's, 32)")
    opt("--dist-timeout", float, dest="dist_timeout_s",
        help_="seconds a collective may wait for a rank before the run stops (default 300)")  # fmt: skip

    opt("--print-freq", int)
    opt("--test-freq", int, help_="steps between evaluations (0: at the end of each epoch)")
    opt("--mlperf-auc-threshold", float, help_="stop once the test AUC reaches this")
    opt("--out-dir", help_="run directory")
    opt("--save-model", help_="write the trained weights here")
    opt("--load-model", help_="start from these weights")
    flag("--inference-only", "only evaluate (with --load-model)")
    p.add_argument("--resume", nargs="?", const="auto", default=argparse.SUPPRESS,
                   help="continue from a checkpoint file, a run directory, or (no value) --out-dir")  # fmt: skip
    opt(
        "--allow-changed",
        help_="with --resume: settings that may differ from the checkpoint's, e.g. lr,test-data-size",
    )
    opt("--keep-checkpoints", int)
    flag("--progress", "progress bars (default: when on a terminal)")
    opt(
        "--perf-log",
        help_="record a few steps after warm-up with torch.profiler; write the perf trace here",
    )
    # low-precision evaluation with --inference-only, as the reference (issue 23)
    opt("--quantize-emb-with-bit", int, help_="--inference-only: tables at 4 or 8 bits (32: fp32)")
    opt(
        "--quantize-mlp-with-bit",
        int,
        help_="--inference-only: MLPs at 8 (int8) or 16 (bf16) bits (32: fp32)",
    )
    assert all(a.dest in d for a in p._actions if a.dest != "help"), "flag without a config field"
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
        summary = Trainer(cfg, rank, world, step_hook=step_hooks.hook_for(cfg)).fit()
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
    if rank == 0:
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

"""The settings of the data, the training step, the run (directory, logging, evaluation,
checkpoints) and multi-process training, each section next to its own rules."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from dlrm.errors import ConfigError
from dlrm.settings.fields import (
    AT_LEAST_0,
    POSITIVE,
    POSITIVE_FINITE,
    Check,
    Section,
    int_range,
    setting,
)

DATA_SETS = ("synthetic", "kaggle", "terabyte", "taobao")
LOSSES = ("bce", "mse")
PRECISIONS = ("fp32", "bf16")
DEVICES = ("auto", "cpu", "cuda")
RAW_DATA_SETS = ("kaggle", "terabyte", "taobao")
# where a None default is filled from (the run's reference recipe, dlrm/recipes/*.toml)
RECIPE = "the data set's reference recipe (docs/training.md#defaults-per-data-set)"


# More threads than this only wait on each other, and thousands crash OpenMP's runtime (libgomp
# ends the process with SIGSEGV): refused before any runtime starts.
THREADS_MAX = 4 * (os.cpu_count() or 1)
THREAD_COUNT = Check(
    lambda v: 0 <= v <= THREADS_MAX,
    f"expected 0 (auto) to {THREADS_MAX} (4 per CPU of this machine)",
)


def sparse_optimizers() -> tuple[str, ...]:
    """The optimizer kinds, asked of their one home when a value is checked (that module
    imports torch: not while --help is parsed)."""
    from embeddings.config import SPARSE_OPTIMIZERS

    return tuple(SPARSE_OPTIMIZERS)


def parse_bag_sizes(text: str | list[int] | tuple[int, ...], flag: str) -> tuple[int, ...]:
    """'3-2-1' or '3,2,1' -> (3, 2, 1): ids per bag, one per categorical feature (how many
    features there are is known once the data is: dlrm/data.py checks the count)."""
    if isinstance(text, (list, tuple)):
        parts = list(text)
    else:
        parts = [p.strip() for p in str(text).replace(",", "-").split("-")]
    sizes = []
    for p in parts:
        if isinstance(p, int) and not isinstance(p, bool):
            sizes.append(p)
            continue
        if not isinstance(p, str) or not p.isdigit():
            raise ConfigError(
                f"{flag}: expected whole numbers separated by '-' or ',' (one per categorical "
                f"feature) like 3-2-1, got {text!r}"
            )
        sizes.append(int(p))
    if not sizes or min(sizes) < 1:
        raise ConfigError(f"{flag}: every bag size must be at least 1, got {text!r}")
    return tuple(sizes)


def unit_interval(closed: str) -> Check:
    """A share: '[)' (0 <= v < 1), '(]' (0 < v <= 1) or '[]'."""
    lo_ok = (lambda v: v >= 0) if closed[0] == "[" else (lambda v: v > 0)
    hi_ok = (lambda v: v <= 1) if closed[1] == "]" else (lambda v: v < 1)
    return Check(
        lambda v: lo_ok(v) and hi_ok(v), f"expected a number in {closed[0]}0, 1{closed[1]}"
    )


@dataclass
class DataConfig(Section):
    """What is trained on: a data set's files or the synthetic generator."""

    title: ClassVar[str] = "Data"

    data_set: str = setting("synthetic", "--data-set", "the data set", choices=DATA_SETS)
    raw_data_file: str | None = setting(None, "--raw-data-file", "raw Criteo/Taobao input")
    processed_data_file: str | None = setting(
        None, "--processed-data-file", "preprocessed dataset directory (made on first use)"
    )
    data_randomize: str = setting(
        "total", "--data-randomize", "shuffling of the training data",
        choices=("none", "day", "total"),
    )  # fmt: skip
    max_ind_range: int | None = setting(
        None, "--max-ind-range", "hash categorical values modulo this many rows",
        shown_default="the data set's reference (Terabyte: 10000000)",
    )  # fmt: skip
    contiguous_ids: bool | None = setting(
        None, "--contiguous-ids",
        "hash mode: renumber each feature's distinct hashed values to 0..n-1, tables of n rows "
        "(the reference's and MLPerf's preprocessing), not M rows",
        shown_default="the data set's reference (MLPerf's DCNv2: true; else false)",
    )  # fmt: skip
    data_sub_sample_rate: float = setting(
        0.0, "--data-sub-sample-rate", "drop this share of negative training samples",
        check=unit_interval("[)"),
    )  # fmt: skip
    frequency_threshold: int = setting(
        0, "--frequency-threshold", "values seen fewer times share one id (Criteo/Taobao)"
    )
    on_bad_line: str = setting(
        "error", "--on-bad-line", "malformed raw lines stop the run or are skipped",
        choices=("error", "skip"),
    )  # fmt: skip
    data_size: int = setting(
        2_097_152, "--data-size", "synthetic: training samples per epoch", check=POSITIVE
    )
    test_data_size: int = setting(
        262_144, "--test-data-size", "synthetic: test samples", check=POSITIVE
    )
    synthetic_zipf: float = setting(
        1.05, "--synthetic-zipf", "synthetic: Zipf exponent of the row accesses",
        check=Check(lambda v: math.isfinite(v) and v >= 0, "expected a finite number >= 0 (0: uniform)"),
    )  # fmt: skip
    synthetic_table_scale: float = setting(
        0.01, "--synthetic-table-scale", "synthetic: scale of the Kaggle table sizes",
        check=Check(lambda v: math.isfinite(v) and v > 0, "expected a positive number"),
    )  # fmt: skip

    # Multi-hot bags (MLPerf DLRM-DCNv2's data shape; docs/data.md#multi-hot-bags). Not `free`:
    # they change every batch, and --resume refuses them changed even with --allow-changed.
    multi_hot_sizes: tuple[int, ...] | None = setting(
        None, "--multi-hot-sizes",
        "ids per bag, one size per categorical feature (dash- or comma-separated; one number: "
        "every feature); Criteo days are materialised once into multi-hot bags, synthetic data "
        "draws them",
        parse=parse_bag_sizes,
        shown_default="one id per feature (with --data-set terabyte --arch-interaction-op dcn "
        "and no other architecture flag: MLPerf's sizes)",
    )  # fmt: skip
    multi_hot_distribution: str = setting(
        "uniform", "--multi-hot-distribution",
        "how a bag's extra ids are drawn from the one-hot id's table (as MLPerf's "
        "materialisation: uniform, or pareto with shape 0.25)",
        choices=("uniform", "pareto"),
    )  # fmt: skip
    multi_hot_materialize: bool = setting(
        True, "--multi-hot-materialize",
        "Criteo: write the bags once beside the preprocessed data and read them (true), or make "
        "each batch's from its one-hot ids as it is loaded (false: the same bags, no disk)",
        free=True,  # the same bags either way
    )  # fmt: skip

    def check(self) -> None:
        if self.data_set == "taobao" and self.multi_hot_sizes is not None:
            raise ConfigError("--multi-hot-sizes: not with --data-set taobao (one id per step)")
        if self.data_set == "synthetic" and self.multi_hot_distribution != "uniform":
            raise ConfigError(
                "--multi-hot-distribution: synthetic bags are Zipf draws (--synthetic-zipf); "
                f"{self.multi_hot_distribution} is how Criteo's bags are materialised"
            )
        if self.data_set in RAW_DATA_SETS and not (self.raw_data_file or self.processed_data_file):
            raise ConfigError(
                f"--data-set {self.data_set}: needs --raw-data-file or --processed-data-file"
            )


@dataclass
class TrainingConfig(Section):
    """The step: batch sizes, epochs, optimizer, learning-rate policy, precision, device, seed."""

    title: ClassVar[str] = "Training"

    mini_batch_size: int | None = setting(
        None, "--mini-batch-size", "training batch", check=POSITIVE, shown_default=RECIPE
    )
    test_mini_batch_size: int | None = setting(
        None, "--test-mini-batch-size", "evaluation batch (-1: the training batch)",
        check=Check(lambda v: v == -1 or v >= 1, "expected a positive integer"),
        shown_default=RECIPE,
    )  # fmt: skip
    nepochs: int = setting(1, "--nepochs", "epochs", check=POSITIVE, free=True)
    num_batches: int = setting(
        0, "--num-batches", "batches per epoch (0: the whole epoch)", check=AT_LEAST_0
    )
    learning_rate: float | None = setting(
        None, "--learning-rate", "learning rate", check=POSITIVE_FINITE, shown_default=RECIPE
    )
    optimizer: str | None = setting(
        None, "--optimizer", "the optimizer (the sparse part fused into backward)",
        choices=sparse_optimizers, shown_default=RECIPE,
    )  # fmt: skip
    loss_function: str = setting("bce", "--loss-function", "the loss", choices=LOSSES)
    lr_num_warmup_steps: int | None = setting(
        None, "--lr-num-warmup-steps", "steps of linear learning-rate warm-up", check=AT_LEAST_0,
        shown_default=RECIPE,
    )  # fmt: skip
    lr_decay_start_step: int | None = setting(
        None, "--lr-decay-start-step", "step where the polynomial decay starts", check=AT_LEAST_0,
        shown_default=RECIPE,
    )  # fmt: skip
    lr_num_decay_steps: int | None = setting(
        None, "--lr-num-decay-steps", "steps of decay (0: none)", check=AT_LEAST_0,
        shown_default=RECIPE,
    )  # fmt: skip
    precision: str = setting(
        "fp32", "--precision", "autocast of the dense part; embeddings stay fp32",
        choices=PRECISIONS,
    )  # fmt: skip
    flush_denormal: bool = setting(
        True, "--flush-denormal",
        "CPU: treat denormal floats as zero (a denormal operand makes oneDNN's bf16 matmuls "
        "several times slower)",
    )  # fmt: skip
    compile: bool | None = setting(
        None, "--compile",
        "compile the dense part with TorchInductor: true, false, or auto (where the compile "
        "pays: the rule is in docs/speed.md#--compile)",
        const=True, shown_default="auto",
    )  # fmt: skip
    device: str = setting("auto", "--device", "where the step runs", choices=DEVICES)
    threads: int = setting(
        0, "--threads",
        "CPU threads of torch and numba (0: auto, the CPUs this process may use: affinity and "
        "cgroup quota; docs/training.md#threads)",
        check=THREAD_COUNT, free=True,  # like the auto count, which differs between machines
    )  # fmt: skip
    seed: int = setting(
        123, "--seed", "seed of initialisation and data order (the reference's --numpy-rand-seed)",
        aliases=("--numpy-rand-seed",), check=int_range(0, 2**32 - 1),  # numpy's and the reference's
    )  # fmt: skip

    def sparse_optimizer(self):
        """The run's optimizer (embeddings/optimizer.py): made here alone, from this section,
        and handed to every part that sizes, places or trains rows."""
        from embeddings.optimizer import (
            SparseOptimizer,  # imports torch: not while --help is parsed
        )

        return SparseOptimizer(self.optimizer, self.learning_rate)

    def check(self) -> None:
        # None: not given, filled from the data set's recipe (TrainConfig checks again then)
        if (
            self.lr_num_decay_steps
            and None not in (self.lr_decay_start_step, self.lr_num_warmup_steps)
            and self.lr_decay_start_step < self.lr_num_warmup_steps
        ):
            raise ConfigError("--lr-decay-start-step: the decay must start after the warm-up ends")


def _comma_names(value: str | tuple | list, flag: str) -> tuple[str, ...]:
    """'lr,test-data-size' -> ('lr', 'test_data_size')."""
    if not isinstance(value, (str, tuple, list)) or not all(isinstance(x, str) for x in value):
        return value  # the type check names it
    names = value.split(",") if isinstance(value, str) else value
    return tuple(x.strip().lstrip("-").replace("-", "_") for x in names if x.strip())


def new_run_dir() -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidate, n = Path("runs") / stamp, 1
    while candidate.exists():
        candidate, n = Path("runs") / f"{stamp}-{n}", n + 1
    return str(candidate)


@dataclass
class RunConfig(Section):
    """The run: its directory, logging, evaluation, checkpoints and resuming."""

    title: ClassVar[str] = "Run, evaluation, checkpoints"

    # free: a resume compares the values it set one by one, wherever the file is now
    recipe: str | None = setting(
        None, "--recipe",
        "a TOML file of settings by flat name, as dlrm/recipes/*.toml; flags given win over it "
        "(docs/training.md#recipes)",
        free=True, shown_default="none (the run's reference recipe, dlrm/recipes/)",
    )  # fmt: skip

    print_freq: int = setting(
        256, "--print-freq", "steps between log lines", check=AT_LEAST_0, free=True
    )
    test_freq: int = setting(
        0, "--test-freq", "steps between evaluations (0: at the end of each epoch)",
        check=AT_LEAST_0, free=True,
    )  # fmt: skip
    mlperf_auc_threshold: float = setting(
        0.0, "--mlperf-auc-threshold", "stop once the test AUC reaches this (0: never)",
        check=unit_interval("[]"), free=True,
    )  # fmt: skip
    out_dir: str = setting(
        "", "--out-dir", "the run directory", free=True, shown_default="a new runs/<date>-<time>"
    )
    save_model: str | None = setting(
        None, "--save-model", "write the trained weights here", free=True
    )
    load_model: str | None = setting(None, "--load-model", "start from these weights", free=True)
    overwrite: bool = setting(
        False, "--overwrite",
        "replace an existing file an output flag names that this product did not write for it "
        "(docs/integrity.md: the output rule)", free=True,
    )  # fmt: skip
    inference_only: bool = setting(
        False, "--inference-only", "only evaluate (with --load-model or --resume)", free=True
    )
    resume: str | None = setting(
        None, "--resume",
        "continue from a checkpoint file, a run directory, or (no value) --out-dir",
        const="auto", free=True,
    )  # fmt: skip
    allow_changed: tuple[str, ...] = setting(
        (), "--allow-changed",
        "with --resume: settings that may differ from the checkpoint's, e.g. lr,test-data-size",
        parse=_comma_names, free=True, shown_default="none",
    )  # fmt: skip
    keep_checkpoints: int = setting(
        2, "--keep-checkpoints", "how many of the newest checkpoints to keep", check=POSITIVE,
        free=True,
    )  # fmt: skip
    progress: bool | None = setting(
        None, "--progress",
        "progress bars: true, false or auto; without a terminal on stdout a line every "
        "--print-freq steps instead (false: none)", const=True, free=True,
        shown_default="auto (a bar when stderr is a terminal)",
    )  # fmt: skip
    tensorboard: bool | None = setting(
        None, "--tensorboard", "TensorBoard event files in RUN/tensorboard: true, false or auto",
        const=True, free=True, shown_default="auto (where TensorBoard is installed)",
    )  # fmt: skip
    perf_log: str | None = setting(
        None, "--perf-log",
        "record a few steps after warm-up with torch.profiler; write the perf trace here",
        free=True,
    )  # fmt: skip
    # low-precision evaluation, the reference's flags (dlrm/models/quantized.py; exported
    # artifacts: python -m hybrid_dlrm.serving.quantize)
    quantize_emb_with_bit: int = setting(
        32, "--quantize-emb-with-bit", "--inference-only: tables at 4 or 8 bits (32: fp32)",
        choices=(4, 8, 32), free=True,
    )  # fmt: skip
    quantize_mlp_with_bit: int = setting(
        32, "--quantize-mlp-with-bit", "--inference-only: MLPs at 8 (int8) or 16 (bf16) bits (32: fp32)",
        choices=(8, 16, 32), free=True,
    )  # fmt: skip

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.out_dir:
            self.out_dir = new_run_dir()
            # a name of ours, not the user's: another run that took it in the same second
            # moves this one to the next name (dlrm/compose.py `_lock_run_dir`)
            self.out_dir_chosen = True

    def check(self) -> None:
        if self.inference_only and not (self.load_model or self.resume):
            raise ConfigError(
                "--inference-only: needs the weights to evaluate, from --load-model or --resume"
            )
        for flag, value in (
            ("--quantize-emb-with-bit", self.quantize_emb_with_bit),
            ("--quantize-mlp-with-bit", self.quantize_mlp_with_bit),
        ):
            if value != 32 and not self.inference_only:
                raise ConfigError(
                    f"{flag}: quantizes the model for evaluation only; use it with --inference-only "
                    "(python -m hybrid_dlrm.serving.quantize exports a quantized model)"
                )


@dataclass
class DistributedConfig(Section):
    """Multi-process training under torchrun (dlrm/processes/distributed.py, embeddings/sharded.py). How
    the tables are split computes the same steps (to float rounding), so --resume may change it."""

    title: ClassVar[str] = "Multi-process training (torchrun)"

    dist_backend: str = setting(
        "auto", "--dist-backend", "under torchrun: auto (nccl with CUDA, else gloo), gloo or nccl",
        choices=("auto", "gloo", "nccl"), free=True,
    )  # fmt: skip
    sharding: str = setting(
        "auto", "--sharding", "under torchrun: how tables are split (row_wise: nccl only)",
        choices=("auto", "table_wise", "column_wise", "row_wise", "data_parallel"), free=True,
    )  # fmt: skip
    sharding_min_columns: int = setting(
        0, "--sharding-min-columns", "narrowest column-wise shard (0: torchrec's default, 32)",
        check=AT_LEAST_0, free=True,
    )  # fmt: skip
    timeout_s: float = setting(
        300.0, "--dist-timeout",
        "seconds a collective may wait for a rank before the run stops (a hung rank)",
        name="dist_timeout_s", free=True,
        check=Check(lambda v: math.isfinite(v) and v > 0, "expected a positive number of seconds"),
    )  # fmt: skip

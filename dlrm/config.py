"""Training configuration: one dataclass, the same fields as the CLI flags (dashes -> underscores)."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

from dlrm.errors import ConfigError
from embeddings.config import SPARSE_OPTIMIZERS
from embeddings.placement import parse_bytes

DATA_SETS = ("synthetic", "kaggle", "terabyte", "taobao")
MODELS = ("dlrm", "tbsm")
LOSSES = ("bce", "mse")
PRECISIONS = ("fp32", "bf16")
DEVICES = ("auto", "cpu", "cuda")


def parse_widths(text: str | list[int] | tuple[int, ...], flag: str) -> tuple[int, ...]:
    """'13-512-256' -> (13, 512, 256), the reference's dash-separated layer widths."""
    if isinstance(text, (list, tuple)):
        widths = tuple(int(x) for x in text)
    else:
        try:
            widths = tuple(int(x) for x in str(text).split("-"))
        except ValueError:
            raise ConfigError(
                f"{flag}: expected dash-separated integers like 13-512-256, got {text!r}"
            ) from None
    if not widths or min(widths) < 1:
        raise ConfigError(f"{flag}: every width must be a positive integer, got {text!r}")
    return widths


def _new_run_dir() -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidate, n = Path("runs") / stamp, 1
    while candidate.exists():
        candidate, n = Path("runs") / f"{stamp}-{n}", n + 1
    return str(candidate)


# The reference configurations (facebookresearch/dlrm's bench scripts for Criteo Kaggle and
# Terabyte, facebookresearch/tbsm's for Taobao) for the fields a run does not set. The synthetic
# data is Kaggle-shaped and takes Kaggle's; DLRM on Taobao is the candidate-step baseline TBSM is
# compared with (scripts/bench_tbsm_vs_dlrm.py).
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


@dataclass
class TrainConfig:
    # model (names as in facebookresearch/dlrm)
    # None: the data set's reference configuration (REFERENCE_ARCH), filled in at construction
    model: str = "dlrm"
    arch_sparse_feature_size: int | None = None
    arch_embedding_size: tuple[int, ...] | None = None  # None: the data set's table sizes
    arch_mlp_bot: tuple[int, ...] | None = None
    arch_mlp_top: tuple[int, ...] | None = None
    arch_interaction_op: str = "dot"
    arch_interaction_itself: bool = False
    embedding_backend: str = "auto"  # auto | fbgemm | torch

    # TBSM (--model tbsm; names and meaning as in facebookresearch/tbsm)
    ts_length: int = 20  # history steps before the candidate
    model_type: str = "tsl"  # tsl | mha | rnn
    tsl_inner: str = "def"  # dot | ind (A w) | def (A^T A w)
    tsl_mechanism: str = "mlp"  # mul | mlp
    tsl_num_heads: int = 1  # TSL components, each with its own MLP
    tsl_mlp: tuple[int, ...] = (15, 15)  # attention MLP hidden widths (ts_length added both ends)
    arch_mlp: tuple[int, ...] = (60, 1)  # final MLP after [context, candidate]
    tsl_proj: bool = True  # project history and candidate onto the unit sphere (tsl)
    mha_num_heads: int = 8
    rnn_num_layers: int = 1
    points_per_user: int = 10  # taobao: positive (and as many negative) samples per user and split

    # data
    data_set: str = "synthetic"
    raw_data_file: str | None = None
    processed_data_file: str | None = None
    data_randomize: str = "total"
    max_ind_range: int | None = None  # None: the reference's for the data set (Terabyte's hashes)
    data_sub_sample_rate: float = 0.0
    frequency_threshold: int = 0
    on_bad_line: str = "error"
    # synthetic data: samples per epoch, test samples, Zipf exponent, scale of the Kaggle tables
    data_size: int = 2_097_152
    test_data_size: int = 262_144
    synthetic_zipf: float = 1.05
    synthetic_table_scale: float = 0.01

    # training
    mini_batch_size: int = 2048
    test_mini_batch_size: int = -1  # -1: same as mini_batch_size
    nepochs: int = 1
    num_batches: int = 0  # batches per epoch; 0: the whole epoch
    learning_rate: float = 0.1
    optimizer: str = "sgd"
    loss_function: str = "bce"
    lr_num_warmup_steps: int = 0
    lr_decay_start_step: int = 0
    lr_num_decay_steps: int = 0
    precision: str = "fp32"
    flush_denormal: bool = True  # CPU: denormal floats read and written as zero (see Trainer)
    compile: bool | None = None  # the dense part compiled by TorchInductor; None: auto (bf16 only)
    device: str = "auto"
    seed: int = 123

    # evaluation, logging, checkpoints
    print_freq: int = 256
    test_freq: int = 0  # steps between evaluations; 0: only at the end
    mlperf_auc_threshold: float = 0.0
    out_dir: str = ""  # empty: a new runs/<date>-<time> directory
    save_model: str | None = None
    load_model: str | None = None
    inference_only: bool = False
    resume: str | None = None  # a checkpoint file, a run directory, or "auto" (this out_dir)
    allow_changed: tuple[str, ...] = ()  # settings --resume may change (dlrm/resume_check.py)
    keep_checkpoints: int = 2
    progress: bool | None = None  # None: only when stderr is a terminal
    perf_log: str | None = None  # directory for a perf trace of a few steps (perfmodel)

    # embedding placement (dlrm/embedding_setup.py): device | host | fae | hotline | auto
    placement: str = "device"
    hot_budget: str = "256MB"  # device-tier bytes for hot rows (weights + optimizer state)
    profile_sample_rate: float = 0.05  # share of the training batches the access profile counts
    profile_file: str | None = None  # reuse this access profile (.npz), or write it here
    placement_plan: str | None = None  # reuse this placement plan (.npz + .json), or write it here
    fae_switch_period: int = 64  # FAE: mini-batches per hot-then-cold scheduling window
    fae_order: str = "interleave"  # interleave | block (the original FAE order, an ablation)
    hotline_prefetch: int = 1  # Hotline: mini-batches whose cold rows are staged ahead (0: none)
    hotline_learn_batches: int = 0  # Hotline: learn popularity online over this many mini-batches

    # low-precision evaluation (issue 23): the reference's flags, with --inference-only only;
    # dlrm/models/quantized.py. Exported artifacts: python -m serving.quantize.
    quantize_emb_with_bit: int = 32  # 4 | 8: row-wise int4 / int8 tables; 32: fp32
    quantize_mlp_with_bit: int = 32  # 8: int8 dynamic quantization; 16: bf16; 32: fp32

    # Slipstream (dlrm/slipstream_pipeline.py, docs/slipstream.md): skip the work of embedding
    # rows that stopped changing; the tracked rows are the placement plan's hot rows
    slipstream: bool = False
    slipstream_mode: str = "drop"  # drop (leave out all-stale inputs) | freeze (no stale updates)
    slipstream_interval: int = 50  # steps between snapshots of the tracked rows
    slipstream_metric: str = "relative"  # relative | absolute L2 drift since the last snapshot
    slipstream_threshold: float | None = None  # explicit drift threshold; None: target skip's
    slipstream_target_skip: float = 0.2  # share of recent inputs the threshold makes skippable
    slipstream_warmup: int = 100  # steps before anything is skipped
    slipstream_control: str = "staleness"  # staleness | random (drops the share at random)
    slipstream_normalize: bool = False  # each feature's pooled embedding scaled to unit L2 norm
    slipstream_min_lookups: int = 8  # lookups per interval before a row may be called stale

    # SSD tier, --placement tiered (embeddings/scm_tier.py, dlrm/scm_setup.py, docs/scm.md)
    scm_dir: str | None = None  # the tier's files (None: <out_dir>/scm)
    scm_cache: str = "256MB"  # DRAM row cache in front of the tier's files
    scm_io: str = "direct"  # direct (O_DIRECT: the page cache bypassed) | buffered
    scm_io_threads: int = 16  # the thread engine's threads (file reads in flight at once)
    scm_io_engine: str = "auto"  # auto (aio for direct I/O where the kernel has it) | aio | threads
    scm_io_depth: int = 64  # the aio engine's requests in flight at once
    embedding_init: str = "auto"  # auto (hashed for tiered, else uniform) | uniform | hashed

    # multi-process training (dlrm/distributed.py, embeddings/sharded.py): under torchrun
    dist_backend: str = "auto"  # auto (nccl with CUDA, else gloo) | gloo | nccl
    sharding: str = "auto"  # auto | table_wise | column_wise | row_wise | data_parallel
    sharding_min_columns: int = 0  # narrowest column-wise shard (0: torchrec's default, 32)
    dist_timeout_s: float = 300.0  # a collective waiting longer ends the run (a hung rank)

    def __post_init__(self) -> None:
        self.reference_defaults = self._fill_reference_defaults()
        self.arch_mlp_bot = parse_widths(self.arch_mlp_bot, "--arch-mlp-bot")
        self.arch_mlp_top = parse_widths(self.arch_mlp_top, "--arch-mlp-top")
        self.tsl_mlp = parse_widths(self.tsl_mlp, "--tsl-mlp")
        self.arch_mlp = parse_widths(self.arch_mlp, "--arch-mlp")
        if self.arch_embedding_size is not None:
            self.arch_embedding_size = parse_widths(
                self.arch_embedding_size, "--arch-embedding-size"
            )
        if isinstance(self.allow_changed, str):  # --allow-changed lr,test-data-size
            self.allow_changed = tuple(x for x in self.allow_changed.split(",") if x)
        self.allow_changed = tuple(
            x.strip().lstrip("-").replace("-", "_") for x in self.allow_changed
        )
        if not self.out_dir:
            self.out_dir = _new_run_dir()
        self.validate()

    def _fill_reference_defaults(self) -> dict:
        """Fields left None take the data set's reference configuration; returns what was filled
        (so it can be printed at start)."""
        reference = REFERENCE_ARCH.get(
            (self.model, self.data_set), REFERENCE_ARCH[("dlrm", "kaggle")]
        )
        filled = {}
        for name, value in reference.items():
            if getattr(self, name) is None:
                setattr(self, name, value)
                filled[name] = value
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

    def validate(self) -> None:
        def choice(flag: str, value: str, options: tuple[str, ...]) -> None:
            if value not in options:
                raise ConfigError(f"{flag}: expected one of {', '.join(options)}, got {value!r}")

        choice("--model", self.model, MODELS)
        choice("--data-set", self.data_set, DATA_SETS)
        choice("--optimizer", self.optimizer, SPARSE_OPTIMIZERS)
        choice("--loss-function", self.loss_function, LOSSES)
        choice("--precision", self.precision, PRECISIONS)
        choice("--device", self.device, DEVICES)
        choice("--arch-interaction-op", self.arch_interaction_op, ("dot", "cat"))
        choice("--embedding-backend", self.embedding_backend, ("auto", "fbgemm", "torch"))
        choice("--data-randomize", self.data_randomize, ("none", "day", "total"))
        choice("--on-bad-line", self.on_bad_line, ("error", "skip"))
        choice("--model-type", self.model_type, ("tsl", "mha", "rnn"))
        choice("--tsl-inner", self.tsl_inner, ("dot", "ind", "def"))
        choice("--tsl-mechanism", self.tsl_mechanism, ("mul", "mlp"))
        positive = {
            "--arch-sparse-feature-size": self.arch_sparse_feature_size,
            "--mini-batch-size": self.mini_batch_size,
            "--nepochs": self.nepochs,
            "--data-size": self.data_size,
            "--test-data-size": self.test_data_size,
            "--keep-checkpoints": self.keep_checkpoints,
            "--ts-length": self.ts_length,
            "--tsl-num-heads": self.tsl_num_heads,
            "--mha-num-heads": self.mha_num_heads,
            "--rnn-num-layers": self.rnn_num_layers,
            "--points-per-user": self.points_per_user,
        }
        for flag, value in positive.items():
            if value < 1:
                raise ConfigError(f"{flag}: expected a positive integer, got {value}")
        for flag, value in {
            "--num-batches": self.num_batches,
            "--test-freq": self.test_freq,
            "--print-freq": self.print_freq,
            "--lr-num-warmup-steps": self.lr_num_warmup_steps,
            "--lr-decay-start-step": self.lr_decay_start_step,
            "--lr-num-decay-steps": self.lr_num_decay_steps,
        }.items():
            if value < 0:
                raise ConfigError(f"{flag}: expected an integer >= 0, got {value}")
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise ConfigError(
                f"--learning-rate: expected a positive finite number, got {self.learning_rate}"
            )
        if not 0 <= self.seed < 2**32:  # numpy's and the reference's seed range
            raise ConfigError(f"--seed: expected an integer from 0 to {2**32 - 1}, got {self.seed}")
        if not (math.isfinite(self.synthetic_zipf) and self.synthetic_zipf >= 0):
            raise ConfigError(
                f"--synthetic-zipf: expected a finite number >= 0 (0: uniform), got {self.synthetic_zipf}"
            )
        if self.inference_only and not (self.load_model or self.resume):
            raise ConfigError(
                "--inference-only: needs the weights to evaluate, from --load-model or --resume"
            )
        if self.test_mini_batch_size == 0 or self.test_mini_batch_size < -1:
            raise ConfigError(
                f"--test-mini-batch-size: expected a positive integer, got {self.test_mini_batch_size}"
            )
        if self.lr_num_decay_steps and self.lr_decay_start_step < self.lr_num_warmup_steps:
            raise ConfigError("--lr-decay-start-step: the decay must start after the warm-up ends")
        if not 0.0 <= self.data_sub_sample_rate < 1.0:
            raise ConfigError(
                f"--data-sub-sample-rate: expected a number in [0, 1), got {self.data_sub_sample_rate}"
            )
        choice(
            "--placement", self.placement, ("device", "host", "fae", "hotline", "tiered", "auto")
        )
        if not 0 <= self.hotline_prefetch <= 8:
            raise ConfigError(
                f"--hotline-prefetch: expected an integer from 0 to 8, got {self.hotline_prefetch}"
            )
        if self.hotline_learn_batches < 0:
            raise ConfigError(
                f"--hotline-learn-batches: expected a non-negative integer, got {self.hotline_learn_batches}"
            )
        choice("--fae-order", self.fae_order, ("interleave", "block"))
        try:
            parse_bytes(self.hot_budget)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if not 0.0 < self.profile_sample_rate <= 1.0:
            raise ConfigError(
                f"--profile-sample-rate: expected a number in (0, 1], got {self.profile_sample_rate}"
            )
        if self.fae_switch_period < 1:
            raise ConfigError(
                f"--fae-switch-period: expected a positive integer, got {self.fae_switch_period}"
            )
        if not 0.0 <= self.mlperf_auc_threshold <= 1.0:
            raise ConfigError(
                f"--mlperf-auc-threshold: expected a number in [0, 1], got {self.mlperf_auc_threshold}"
            )
        if not (math.isfinite(self.synthetic_table_scale) and self.synthetic_table_scale > 0):
            raise ConfigError("--synthetic-table-scale: expected a positive number")
        self._validate_slipstream()
        self._validate_scm()
        choice("--dist-backend", self.dist_backend, ("auto", "gloo", "nccl"))
        choice("--sharding", self.sharding,
               ("auto", "table_wise", "column_wise", "row_wise", "data_parallel"))  # fmt: skip
        if self.sharding_min_columns < 0:
            raise ConfigError(
                f"--sharding-min-columns: expected an integer >= 0, got {self.sharding_min_columns}"
            )
        if not (math.isfinite(self.dist_timeout_s) and self.dist_timeout_s > 0):
            raise ConfigError(
                f"--dist-timeout: expected a positive number of seconds, got {self.dist_timeout_s}"
            )
        if self.data_set in ("kaggle", "terabyte", "taobao") and not (
            self.raw_data_file or self.processed_data_file
        ):
            raise ConfigError(
                f"--data-set {self.data_set}: needs --raw-data-file or --processed-data-file"
            )
        self._validate_quantize()

    def _validate_quantize(self) -> None:
        """--quantize-emb-with-bit / --quantize-mlp-with-bit (issue 23)."""
        for flag, value, options in (
            ("--quantize-emb-with-bit", self.quantize_emb_with_bit, (4, 8, 32)),
            ("--quantize-mlp-with-bit", self.quantize_mlp_with_bit, (8, 16, 32)),
        ):
            if value not in options:
                raise ConfigError(
                    f"{flag}: expected one of {', '.join(map(str, options))}, got {value}"
                )
            if value != 32 and not self.inference_only:
                raise ConfigError(
                    f"{flag}: quantizes the model for evaluation only; use it with --inference-only "
                    "(python -m serving.quantize exports a quantized model)"
                )

    def _validate_slipstream(self) -> None:
        for flag, value, options in (
            ("--slipstream-mode", self.slipstream_mode, ("drop", "freeze")),
            ("--slipstream-metric", self.slipstream_metric, ("relative", "absolute")),
            ("--slipstream-control", self.slipstream_control, ("staleness", "random")),
        ):
            if value not in options:
                raise ConfigError(f"{flag}: expected one of {', '.join(options)}, got {value!r}")
        if self.slipstream_interval < 1:
            raise ConfigError(
                f"--slipstream-interval: expected a positive integer, got {self.slipstream_interval}"
            )
        if self.slipstream_warmup < 0:
            raise ConfigError(
                f"--slipstream-warmup: expected an integer >= 0, got {self.slipstream_warmup}"
            )
        t = self.slipstream_threshold
        if t is not None and not (math.isfinite(t) and t >= 0):
            raise ConfigError(f"--slipstream-threshold: expected a finite number >= 0, got {t}")
        p = self.slipstream_target_skip
        if not (math.isfinite(p) and 0.0 <= p < 1.0):
            raise ConfigError(f"--slipstream-target-skip: expected a number in [0, 1), got {p}")
        if self.slipstream_control == "random" and self.slipstream_mode == "drop" and p == 0:
            raise ConfigError(
                "--slipstream-control random: drops --slipstream-target-skip of the inputs, "
                "which is 0"
            )
        if self.slipstream_min_lookups < 0:
            raise ConfigError(
                "--slipstream-min-lookups: expected an integer >= 0, got "
                f"{self.slipstream_min_lookups}"
            )
        if self.slipstream_normalize and not self.slipstream:
            raise ConfigError("--slipstream-normalize: only with --slipstream")
        if self.slipstream and self.hotline_learn_batches:
            raise ConfigError(
                "--slipstream: tracks the plan's hot rows, which --hotline-learn-batches only "
                "knows after training has begun; plan from a profile instead"
            )

    def _validate_scm(self) -> None:
        """The SSD tier's flags (--placement tiered)."""
        for flag, value, options in [
            ("--scm-io", self.scm_io, ("direct", "buffered")),
            ("--scm-io-engine", self.scm_io_engine, ("auto", "aio", "threads")),
            ("--embedding-init", self.embedding_init, ("auto", "uniform", "hashed")),
        ]:
            if value not in options:
                raise ConfigError(f"{flag}: expected one of {', '.join(options)}, got {value!r}")
        try:
            parse_bytes(self.scm_cache, "--scm-cache")
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if not 1 <= self.scm_io_threads <= 256:
            raise ConfigError(
                f"--scm-io-threads: expected an integer from 1 to 256, got {self.scm_io_threads}"
            )
        if not 1 <= self.scm_io_depth <= 1024:
            raise ConfigError(
                f"--scm-io-depth: expected an integer from 1 to 1024, got {self.scm_io_depth}"
            )
        if self.scm_io_engine == "aio" and self.scm_io != "direct":
            raise ConfigError(
                "--scm-io-engine aio: needs --scm-io direct (AIO blocks on buffered files)"
            )
        if self.embedding_init == "hashed" and self.placement not in ("device", "tiered"):
            raise ConfigError(
                "--embedding-init hashed: supported by --placement device and tiered, "
                f"not {self.placement}"
            )
        if self.placement == "tiered":
            if self.embedding_init == "uniform":
                raise ConfigError(
                    "--embedding-init uniform: --placement tiered initialises every row as a "
                    "pure function of seed, table and row (hashed), so untouched rows need no storage"
                )
            if self.hotline_learn_batches:
                raise ConfigError(
                    "--hotline-learn-batches: not with --placement tiered (its plan is fixed)"
                )

    @property
    def eval_batch_size(self) -> int:
        return (
            self.mini_batch_size if self.test_mini_batch_size == -1 else self.test_mini_batch_size
        )

    def to_json(self) -> dict:
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def from_json(cls, data: dict) -> TrainConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"config: unknown fields {', '.join(unknown)}")
        return cls(**data)

    def arch_signature(self) -> dict:
        """What must match for a checkpoint to load into this model."""
        keys = [
            "model", "arch_sparse_feature_size", "arch_embedding_size", "arch_mlp_bot",
            "arch_mlp_top", "arch_interaction_op", "arch_interaction_itself", "optimizer",
        ]  # fmt: skip
        if self.model == "tbsm":
            keys += ["ts_length", "model_type", "tsl_inner", "tsl_mechanism", "tsl_num_heads", "tsl_mlp",
                     "arch_mlp", "tsl_proj", "mha_num_heads", "rnn_num_layers"]  # fmt: skip
        out = {k: getattr(self, k) for k in keys}
        return json.loads(json.dumps(out))

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir)

"""Where embedding rows live (`--placement`) and the settings of each placement's own part: FAE,
Hotline, the SSD tier; and Slipstream, which skips the work of the plan's stale hot rows."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from dlrm.errors import ConfigError
from dlrm.placement.kinds import AUTO, CHOICES, all_kinds
from dlrm.settings.fields import (
    AT_LEAST_0,
    FINITE_AT_LEAST_0,
    POSITIVE,
    ByteSize,
    Check,
    Section,
    byte_size,
    int_range,
    setting,
)
from dlrm.settings.sections import unit_interval

# --placement-trial's choices (dlrm/placement/trials.py): never, a close call's, always
TRIAL_MODES = ("off", "auto", "always")

# --placement's choices, {value: what it means}: the registered placement kinds and auto, read
# from the registry whenever read (dlrm/placement/kinds.py)
PLACEMENTS = CHOICES


@dataclass
class PlacementConfig(Section):
    """Which placement, its device budget, and the profile and plan it is made from."""

    title: ClassVar[str] = "Placement"

    placement: str = setting(
        "device", "--placement", "where embedding rows live", choices=PLACEMENTS
    )
    hot_budget: ByteSize = setting(
        "256MB", "--hot-budget",
        "device bytes for hot rows, weights + optimizer state (e.g. 256MB, 2GB; binary units)",
        parse=byte_size,
    )  # fmt: skip
    profile_sample_rate: float = setting(
        0.05, "--profile-sample-rate", "share of the training batches the access profile counts",
        check=unit_interval("(]"),
    )  # fmt: skip
    profile_file: str | None = setting(
        None, "--profile-file", "access profile (.npz): reused when it exists, else written"
    )
    placement_plan: str | None = setting(
        None,
        "--placement-plan",
        "placement plan (.npz + .json): reused when it exists, else written",
    )
    embedding_init: str = setting(
        "auto", "--embedding-init",
        "initial rows: auto (hashed for tiered, else uniform), uniform, or hashed (each row a pure "
        "function of seed, table and row)",
        choices=("auto", "uniform", "hashed"),
    )  # fmt: skip

    memory_limit: ByteSize | None = setting(
        None, "--memory-limit",
        "host DRAM this run may use at most (e.g. 24GB): a run planned for a smaller machine; "
        "the placement's needs are checked against it before any table is made",
        parse=byte_size, free=True, shown_default="what the machine, cgroup and ulimit allow",
    )  # fmt: skip
    device_memory_limit: ByteSize | None = setting(
        None, "--device-memory-limit", "CUDA memory this run may use at most (e.g. 16GB)",
        parse=byte_size, free=True, shown_default="the device's free memory",
    )  # fmt: skip

    placement_trial: str = setting(
        "auto", "--placement-trial",
        "auto: measure a close call's shortlist on the run's first batches before committing "
        "(at most 3% of the run's predicted time); always: measure whatever the predictions and "
        "the budget; off: the prediction decides",
        choices=TRIAL_MODES, free=True,  # it picks a placement; each computes what it computes
    )  # fmt: skip

    def memory_bytes(self) -> int | None:
        """`--memory-limit` in bytes (None: what the machine allows)."""
        return None if self.memory_limit is None else self.memory_limit.bytes

    def device_memory_bytes(self) -> int | None:
        """`--device-memory-limit` in bytes (None: the device's free memory)."""
        return None if self.device_memory_limit is None else self.device_memory_limit.bytes

    def check(self) -> None:
        # a kind's own rules (its initial rows among them) are its `check`, run by TrainConfig's
        # check with every section at hand; auto's choice is not known yet, so it starts uniform
        if self.placement == AUTO and self.embedding_init == "hashed":
            able = [k.name for k in all_kinds() if "hashed" in k.initial_rows]
            raise ConfigError(
                f"--embedding-init hashed: supported by --placement {' and '.join(able)}, not auto"
            )


@dataclass
class FaeConfig(Section):
    """`--placement fae`: the scheduler of hot and cold mini-batches."""

    title: ClassVar[str] = "FAE (--placement fae)"

    switch_period: int = setting(
        64, "--fae-switch-period", "fae: mini-batches per hot-then-cold window", check=POSITIVE
    )
    order: str = setting(
        "interleave", "--fae-order",
        "fae: interleave, or block (all cold then all hot, the original order, an ablation)",
        choices=("interleave", "block"),
    )  # fmt: skip


@dataclass
class HotlineConfig(Section):
    """`--placement hotline`: staging cold rows ahead, or learning popularity online."""

    title: ClassVar[str] = "Hotline (--placement hotline)"

    prefetch: int = setting(
        1, "--hotline-prefetch",
        "hotline: mini-batches whose cold rows are staged ahead on a worker (0: none)",
        check=int_range(0, 8), free=True,  # the same numbers whatever is staged ahead
    )  # fmt: skip
    learn_batches: int = setting(
        0, "--hotline-learn-batches",
        "hotline: learn row popularity over the first N mini-batches instead of a profile (0: off)",
        check=Check(lambda v: v >= 0, "expected a non-negative integer"),
    )  # fmt: skip


@dataclass
class ScmConfig(Section):
    """`--placement tiered`: the SSD tier (embeddings/ssd/tier.py, dlrm/placement/tiered_setup.py,
    docs/scm.md). How it caches and reads returns the same rows, so --resume may change that."""

    title: ClassVar[str] = "SSD tier (--placement tiered)"

    directory: str | None = setting(
        None, "--scm-dir", "tiered: directory of the SSD tier's files",
        shown_default="OUT_DIR/scm",
    )  # fmt: skip
    cache: ByteSize = setting(
        "256MB", "--scm-cache", "tiered: DRAM row cache in front of the tier's files",
        parse=byte_size, free=True,
    )  # fmt: skip
    io: str = setting(
        "direct", "--scm-io",
        "tiered: direct (O_DIRECT: the page cache bypassed) or buffered",
        choices=("direct", "buffered"), free=True,
    )  # fmt: skip
    io_threads: int = setting(
        16, "--scm-io-threads", "tiered: I/O threads of the thread engine (reads in flight)",
        check=int_range(1, 256), free=True,
    )  # fmt: skip
    io_engine: str = setting(
        "auto", "--scm-io-engine",
        "tiered: auto (Linux AIO with direct I/O where the kernel has it), aio or threads",
        choices=("auto", "aio", "threads"), free=True,
    )  # fmt: skip
    io_depth: int = setting(
        64, "--scm-io-depth", "tiered: AIO requests in flight at once", check=int_range(1, 1024),
        free=True,
    )  # fmt: skip
    layout: str = setting(
        "profile", "--scm-layout",
        "tiered: where a new tier file puts each row: profile (the rows the access profile "
        "counts most first, a profiled input's rows together: rows read together share 4 KiB "
        "blocks) or identity (row-id order); a resumed tier keeps its own",
        choices=("profile", "identity"), free=True,  # a tier keeps the layout it was made with
    )  # fmt: skip
    log_share: float = setting(
        0.25, "--scm-log-share",
        "tiered: share of --scm-cache's bytes given to the write-back log's map: rows evicted "
        "dirty are appended to a log, many to a 4 KiB block, and swept into their blocks in "
        "the file's order; 0: each evicted row patched into its block at once",
        check=unit_interval("[)"), free=True,  # where a row waits, never its value
    )  # fmt: skip

    overcommit: bool = setting(
        False, "--scm-overcommit",
        "tiered: check the disk for the blocks the run's lookups can write at most (steps x "
        "ids per step, each table's part no more than its blocks; the whole file where the "
        "steps are not known ahead) instead of the whole sparse file; the journal's "
        "pre-images are not counted, and a disk that fills stops the run in one line with "
        "its last checkpoint intact",
        free=True,  # it changes what is checked, not a number computed
    )  # fmt: skip

    def check(self) -> None:
        if self.io_engine == "aio" and self.io != "direct":
            raise ConfigError(
                "--scm-io-engine aio: needs --scm-io direct (AIO blocks on buffered files)"
            )


@dataclass
class SlipstreamConfig(Section):
    """Slipstream (dlrm/pipelines/slipstream.py, docs/slipstream.md): skip the work of embedding
    rows that stopped changing; the tracked rows are the placement plan's hot rows."""

    title: ClassVar[str] = "Slipstream (--slipstream)"

    enabled: bool = setting(
        False, "--slipstream", "skip the work of embedding rows that stopped changing",
        name="slipstream",
    )  # fmt: skip
    mode: str = setting(
        "drop", "--slipstream-mode",
        "slipstream: drop (leave out all-stale inputs) or freeze (no updates of stale rows)",
        choices=("drop", "freeze"),
    )  # fmt: skip
    interval: int = setting(
        50, "--slipstream-interval", "slipstream: steps between snapshots of the tracked rows",
        check=POSITIVE,
    )  # fmt: skip
    metric: str = setting(
        "relative", "--slipstream-metric", "slipstream: relative or absolute L2 drift since the "
        "last snapshot", choices=("relative", "absolute"),
    )  # fmt: skip
    threshold: float | None = setting(
        None, "--slipstream-threshold", "slipstream: drift below which a row is stale",
        check=FINITE_AT_LEAST_0, shown_default="from --slipstream-target-skip",
    )  # fmt: skip
    target_skip: float = setting(
        0.2, "--slipstream-target-skip",
        "slipstream: without a threshold, the share of recent inputs to make skippable",
        check=Check(lambda v: math.isfinite(v) and 0 <= v < 1, "expected a number in [0, 1)"),
    )  # fmt: skip
    warmup: int = setting(
        100, "--slipstream-warmup", "slipstream: steps before anything is skipped", check=AT_LEAST_0
    )
    control: str = setting(
        "staleness", "--slipstream-control",
        "slipstream: staleness, or random (drops the share at random: the control)",
        choices=("staleness", "random"),
    )  # fmt: skip
    normalize: bool = setting(
        False, "--slipstream-normalize",
        "slipstream: scale each feature's pooled embedding to unit L2 norm",
    )  # fmt: skip
    min_lookups: int = setting(
        8, "--slipstream-min-lookups",
        "slipstream: trained lookups per interval before a row may be called stale",
        check=AT_LEAST_0,
    )  # fmt: skip

    def check(self) -> None:
        if self.control == "random" and self.mode == "drop" and self.target_skip == 0:
            raise ConfigError(
                "--slipstream-control random: drops --slipstream-target-skip of the inputs, "
                "which is 0"
            )
        if self.normalize and not self.enabled:
            raise ConfigError("--slipstream-normalize: only with --slipstream")

"""The placement planner's contract: a candidate placement, a predicted step time, and who predicts.

`--placement auto` (dlrm/placement/auto.py) lists candidates (device, host, FAE, Hotline, tiered, over a
grid of hot budgets and DRAM cache sizes that fit the memory inventory), asks the registered
predictor for each one's step time, and picks the fastest that fits. The predictor is the
performance model's (perfmodel/placement_costs.py), which registers itself here when its plugin
module is imported (`dlrm.pipelines.step_hooks.load_plugins`), because `dlrm` never imports `perfmodel`
(tests/test_layers.py). Without a predictor the planner still decides, by a fixed order of
preference, and says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

KINDS = ("device", "host", "fae", "hotline", "tiered")
# the run's first batches a predictor may replay in order (PlanningSample.stream)
STREAM_BATCHES = 48


@dataclass(frozen=True)
class Candidate:
    """One placement the planner weighs: its kind and the sizes it is tuned by (bytes).

    `hot_budget`: device-tier bytes of hot rows, weights + optimizer state (fae, hotline, tiered);
    `scm_cache`: the tiered placement's DRAM row cache."""

    placement: str
    hot_budget: int = 0
    scm_cache: int = 0

    def __post_init__(self) -> None:
        if self.placement not in KINDS:
            raise ValueError(f"unknown placement {self.placement!r}; expected one of {KINDS}")

    def settings(self) -> dict[str, Any]:
        """The TrainConfig fields (flat names) that make a run use this candidate."""
        out: dict[str, Any] = {"placement": self.placement}
        if self.placement in ("fae", "hotline", "tiered"):
            out["hot_budget"] = self.hot_budget
        if self.placement == "tiered":
            out["scm_cache"] = self.scm_cache
        return out

    def label(self) -> str:
        from embeddings.room import flag_bytes

        parts = [self.placement]
        if self.placement in ("fae", "hotline", "tiered"):
            parts.append(f"hot {flag_bytes(self.hot_budget)}")
        if self.placement == "tiered":
            parts.append(f"cache {flag_bytes(self.scm_cache)}")
        return ", ".join(parts)


@dataclass
class Prediction:
    """A candidate's predicted time per training step and where it goes.

    `parts`: milliseconds per part (e.g. dense, lookup, staging, disk, hidden); `detail`: the
    figures the prediction came from (hit rate, reads per step, bytes moved, ...), JSON-able;
    `detail["checked_ms"]`, where present: the mean over the run's first steps, which the
    placement check measures (dlrm/placement/auto_check.py), when it differs from the run's mean (a
    tiered run's cache starts empty)."""

    ms_per_step: float
    parts: dict[str, float] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class PlanningSample:
    """What the planner reads once for all candidates (dlrm/placement/auto.py's `read_sample`).

    `tables`: the run's `embeddings.TableSpec`s (feature name, rows, width), in feature order;
    `profile`: the access profile (`embeddings.profile.AccessProfile`: per table, each row's
    lookups over `--profile-sample-rate` of the epoch-0 training batches), made or reused as a
    run makes it (dlrm/placement/run_plan.py's `obtain_profile`);
    `batches`: the sparse features (torchrec `KeyedJaggedTensor`, keys in feature order, ids
    global per table) of `len(batch_indices)` epoch-0 training batches evenly spread over the
    ones the profile did not count, in data order: what a predictor replays a cache policy on;
    `batch_indices`: their positions in the epoch, of `batches_per_epoch`;
    `inventory`: what this process may use per tier (`embeddings.room.MemoryInventory`);
    `steps`: the steps of the run a prediction is the mean over, [first, end) (the planner's:
    the whole run, `--num-batches` or the epoch times `--nepochs`): a tiered run's cache starts
    empty, so its step time changes as it fills;
    `stream()`: the sparse features of the run's first batches (up to STREAM_BATCHES) the profile
    did not count, in run order, read on the first call: what a predictor replays a cache that
    starts empty on."""

    tables: list
    profile: Any
    batches: list
    batch_indices: list[int]
    batches_per_epoch: int
    inventory: Any = None
    steps: tuple[int, int] = (0, 0)
    stream: Callable[[], list] = lambda: []


# (cfg with the candidate's settings applied, the candidate, the PlanningSample) -> Prediction.
Predictor = Callable[[Any, Candidate, Any], Prediction]

_PREDICTOR: Predictor | None = None


def register_predictor(fn: Predictor) -> None:
    global _PREDICTOR
    _PREDICTOR = fn


def predictor() -> Predictor | None:
    return _PREDICTOR

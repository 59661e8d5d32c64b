"""The placement planner's contract: a candidate placement, its typed time and memory breakdowns,
the planning sample, and the two faces the planner is built from (dlrm/placement/auto.py's
`Planner`): a predictor, and the step costs a kind's prediction is made of.

A kind (dlrm/placement/kinds.py) proposes candidates and predicts them from `StepCosts`, the
performance model's pieces (perfmodel/placement_costs.py's `PlacementCosts`), which `dlrm` never
imports (tests/test_layers.py): the planner's default predictor finds the factory a plugin
module names (`default_costs`), one fresh object per plan, so nothing a plan memoises outlives
it. A test or a library user passes any `Predictor` instead.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from dlrm.placement.kinds import SIZES, placement_kind

# the run's first batches a predictor may replay in order (PlanningSample.stream)
STREAM_BATCHES = 48


@dataclass(frozen=True)
class Candidate:
    """One placement the planner weighs: its kind and the sizes it is tuned by (bytes).

    `hot_budget`: device-tier bytes of hot rows, weights + optimizer state (fae, hotline, tiered);
    `scm_cache`: the tiered placement's DRAM row cache. A kind's `tuned_by` says which apply."""

    placement: str
    hot_budget: int = 0
    scm_cache: int = 0

    def __post_init__(self) -> None:
        placement_kind(self.placement)  # UnknownPlacement (a KeyError) naming the kinds

    @property
    def kind(self):
        return placement_kind(self.placement)

    def settings(self) -> dict[str, Any]:
        """The TrainConfig fields (flat names) that make a run use this candidate."""
        return {"placement": self.placement, **{s: getattr(self, s) for s in self.kind.tuned_by}}

    def label(self) -> str:
        from embeddings.room import flag_bytes

        shown = {"hot_budget": "hot", "scm_cache": "cache"}
        return ", ".join(
            [self.placement]
            + [
                f"{shown[s]} {flag_bytes(getattr(self, s))}"
                for s in SIZES
                if s in self.kind.tuned_by
            ]
        )


# --- typed breakdowns -----------------------------------------------------------------------------


@dataclass
class StepTime:
    """Milliseconds per training step by part (None: the part does not apply to the candidate).

    dense: everything but the lookups; lookup: the embedding kernels; link: pooled embeddings to
    the device and their gradients back (host on CUDA); load: the step thread's staging of the
    batch's rows into the slots and the previous batch's home; staging: the worker's mapping and
    gathering; disk: the SSD tier's reads; hidden: minus what a prefetching worker overlaps;
    `other`: parts of another predictor (a decision file keeps what it was given)."""

    dense: float | None = None
    lookup: float | None = None
    link: float | None = None
    load: float | None = None
    staging: float | None = None
    disk: float | None = None
    hidden: float | None = None
    other: dict[str, float] = field(default_factory=dict)

    def total(self) -> float:
        return float(sum(self.to_json().values()))

    def to_json(self) -> dict[str, float]:
        """{part: ms} of the parts that apply (the dict the decision file held before)."""
        named = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "other"}
        return {**{k: float(v) for k, v in named.items() if v is not None}, **self.other}

    @classmethod
    def from_json(cls, d: dict | None) -> StepTime:
        d = dict(d or {})
        names = {f.name for f in fields(cls)} - {"other"}
        return cls(**{k: float(d.pop(k)) for k in list(d) if k in names},
                   other={k: float(v) for k, v in d.items()})  # fmt: skip


MEMORY_TIERS = ("device", "host")
TIER_ORDER = ("device", "host", "disk")


@dataclass(frozen=True)
class TierBytes:
    """Bytes a candidate needs per tier (on the CPU the device's are host DRAM)."""

    device: int = 0
    host: int = 0
    disk: int = 0

    def on(self, tier: str) -> int:
        return int(getattr(self, tier))

    def memory(self) -> int:
        """Device and host together: what equal predictions are broken by."""
        return sum(self.on(t) for t in MEMORY_TIERS)

    def items(self):
        return [(t, self.on(t)) for t in TIER_ORDER if self.on(t)]

    def to_json(self) -> dict[str, int]:
        return dict(self.items())

    @classmethod
    def from_json(cls, d: dict | None) -> TierBytes:
        return cls(**{k: int(v) for k, v in (d or {}).items() if k in TIER_ORDER})

    @classmethod
    def of(cls, needs) -> TierBytes:
        """From `embeddings.room.Needs`."""
        return cls(*(int(needs.on(t)) for t in TIER_ORDER))


@dataclass
class Prediction:
    """A candidate's predicted time per training step and where it goes.

    `parts`: StepTime; `detail`: the figures the prediction came from (hit rate, reads per step,
    bytes moved, ...), JSON-able; `detail["checked_ms"]`, where present: the mean over the run's
    first steps, which the placement check measures (dlrm/placement/auto_check.py), when it
    differs from the run's mean (a tiered run's cache starts empty)."""

    ms_per_step: float
    parts: StepTime = field(default_factory=StepTime)
    detail: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, parts: StepTime, detail: dict[str, Any] | None = None) -> Prediction:
        """The prediction whose time is the sum of its parts."""
        return cls(parts.total(), parts, dict(detail or {}))


# --- the planning sample --------------------------------------------------------------------------


class PlanMemo:
    """What one plan's predictions share (a hot set's plan, its map, the cold rows of each
    batch, a captured step), keyed by value, never by `id()`: owned by one plan and dropped with
    it, so a process that plans twice never reuses the first plan's figures for the second."""

    def __init__(self) -> None:
        self._values: dict[tuple, Any] = {}

    def get(self, key: tuple, make: Callable[[], Any]) -> Any:
        if key not in self._values:
            self._values[key] = make()
        return self._values[key]

    def __len__(self) -> int:
        return len(self._values)


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
    starts empty on;
    `memo`: this plan's shared figures (PlanMemo)."""

    tables: list
    profile: Any
    batches: list
    batch_indices: list[int]
    batches_per_epoch: int
    inventory: Any = None
    steps: tuple[int, int] = (0, 0)
    stream: Callable[[], list] = lambda: []
    memo: PlanMemo = field(default_factory=PlanMemo, repr=False, compare=False)


# --- who predicts ---------------------------------------------------------------------------------

# (cfg with the candidate's settings applied, the candidate, the PlanningSample) -> Prediction.
Predictor = Callable[[Any, Candidate, PlanningSample], Prediction]


class StepCosts(Protocol):
    """The performance model's pieces a kind's `predict` is made of (perfmodel/placement_costs.py
    `PlacementCosts`, one per plan)."""

    def captured(self, cfg: Any, sample: PlanningSample, placement: str) -> Prediction:
        """The step of `placement` as captured and predicted whole (device, host, fae)."""
        ...

    def link(self, cfg: Any, sample: PlanningSample) -> tuple[float, int]:
        """(ms, bytes) of the pooled embeddings to the device and back; (0, 0) without CUDA."""
        ...

    def staged(
        self, cfg: Any, candidate: Candidate, sample: PlanningSample, cold: str
    ) -> Prediction:
        """The device step over the hot rows and a batch's staged cold rows, read from `cold`
        ("host" DRAM or the SSD tier, "disk")."""
        ...


# a plugin module (the `hybrid_dlrm.plugins` entry points, HYBRID_DLRM_PLUGINS) that provides the
# step costs names their factory in this attribute, "module:callable"
COSTS_ATTRIBUTE = "PLACEMENT_COSTS"


def default_costs() -> Callable[[], StepCosts] | None:
    """The step costs' factory the installed plugins name (None: no performance model): looked
    up when a plan starts, never registered by an import's side effect."""
    from dlrm.pipelines.step_hooks import plugin_modules

    for module in plugin_modules():
        spec = getattr(module, COSTS_ATTRIBUTE, None)
        if spec:
            where, _, name = spec.partition(":")
            return getattr(importlib.import_module(where), name)
    return None


class KindPredictor:
    """The planner's default predictor: each candidate's kind predicts it from `costs` (one
    object per plan: what it memoises is that plan's)."""

    def __init__(self, costs: StepCosts) -> None:
        self.costs = costs

    def __call__(self, cfg: Any, candidate: Candidate, sample: PlanningSample) -> Prediction:
        return candidate.kind.predict(self.costs, cfg, candidate, sample)

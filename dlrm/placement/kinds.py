"""Placement kinds: one registered `PlacementKind` per `--placement` value (device, host, fae,
hotline, tiered, ...) that answers every question the run, the memory check, the planner and
torchrun used to ask by the placement's name: the settings it is tuned by and its rules on
them, its bytes per memory tier, how its collection is built, the candidates it proposes to
the planner, how its step time is predicted, and whether it runs under several processes.

A new kind is its object plus one line in `BUILT_IN` (or a `register(kind)` call, as the toy
kind of tests/dlrm/test_placement_kind_contract.py does), never edits where placements are used.

No torch here, and no import of the kinds' modules: `--help` lists `--placement`'s choices from
this registry, and a built-in kind's module is imported (by name, so the settings that read the
registry and the collections a kind builds form no import cycle) only when it is first asked for.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from hybrid_dlrm.common.registry import Registry

if TYPE_CHECKING:  # dlrm's own types are Any here: the settings import this module, and the
    # modules those types live in import the settings (tests/test_layers.py counts these too)
    import torch

    from embeddings.config import TableSpec
    from embeddings.room import Needs

Candidate = CandidateSpace = Prediction = StepCosts = PlacedEmbeddings = Any

# name -> the module defining it (as an attribute named after the kind, upper case)
BUILT_IN: dict[str, str] = dict.fromkeys(
    ("device", "host", "fae", "hotline", "tiered"), "dlrm.placement.builtin_kinds"
)
AUTO = (
    "auto"  # --placement's choice that is no kind: the planner picks one (dlrm/placement/auto.py)
)
AUTO_HELP = (
    "the planner chooses: device when every table fits the device's memory, else the "
    "fastest predicted placement and budgets that fit the memory inventory (docs/placement.md)"
)
# the sizes a candidate may be tuned by (Candidate's fields; flat setting names)
SIZES = ("hot_budget", "scm_cache")


@runtime_checkable
class PlacementKind(Protocol):
    """A placement as the run, the memory check, the planner and torchrun use it. `cfg` below is
    the run's TrainConfig with this kind's settings applied; a kind reads only its sections."""

    # --placement's value, the run summary's `placement.kind`, the decision file's `placement`
    name: str
    # --help's and the docs' line for the choice
    help: str
    # the candidate sizes (SIZES) it is tuned by: what a decision records and applies
    tuned_by: tuple[str, ...]
    # without a predictor (or on equal predictions) the planner prefers the lower
    preference: int
    # how it runs under torchrun: "sharded" (every table sharded by torchrec's planner),
    # "hot_replicated" (hot rows on every rank, cold rows sharded), or None (refused)
    multi_process: str | None
    # its hot rows leave the host tables (one home), as against replicated on the device
    one_home: bool
    # the --embedding-init values (besides auto) it can start from
    initial_rows: tuple[str, ...]
    # one process trains the batches in another order than several (FAE's schedule): a
    # checkpoint resumes only with as many processes as wrote it
    regroups_batches: bool

    def check(self, cfg: Any) -> None:
        """Its rules on the settings (ConfigError naming the flag); called for every config."""
        ...

    def settings(self, candidate: Candidate, cfg: Any) -> dict[str, Any]:
        """The flat settings a run of `candidate` is made with (beyond `placement` and its sizes:
        e.g. where its files go)."""
        ...

    def memory_needs(self, cfg: Any, tables: list[TableSpec]) -> Needs:
        """Bytes it allocates per tier (device, host, disk) before training: bounds from budgets,
        as the pre-flight memory check and the planner count them."""
        ...

    def rows_on_device(self, candidate: Candidate, total: int) -> int:
        """Bytes of embedding rows (weights + optimizer state) `candidate` keeps on the device,
        of `total`: what a `--hot-budget` given to `--placement auto` bounds."""
        ...

    def build(
        self, cfg: Any, tables: list[TableSpec], train_source: Any, device: torch.device
    ) -> PlacedEmbeddings:
        """Its embedding collection (and plan, if it has one) for one process."""
        ...

    def training_data(self, cfg: Any, data: Any, placed: PlacedEmbeddings, per_epoch: int) -> Any:
        """The data splits it trains on (FAE regroups the training batches; most keep them)."""
        ...

    def bytes_per_sample(self, candidate: Candidate, coverage: Any) -> float | None:
        """Embedding bytes `candidate` moves between host and device per sample, from what its
        hot set covers of the profile (dlrm/placement/enumerator.py's `Coverage`); None: not
        known. The planner drops a hot set that moves no fewer than the plain placement's."""
        ...

    def candidates(self, space: CandidateSpace) -> list[Candidate]:
        """What it proposes to the planner: itself at the sizes `space` offers that suit it."""
        ...

    def predict(self, costs: StepCosts, cfg: Any, candidate: Candidate, sample: Any) -> Prediction:
        """Its predicted step time from the performance model's pieces (`costs`: perfmodel's
        PlacementCosts, scoped to one plan)."""
        ...


class UnknownPlacement(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


_kinds: Registry[PlacementKind] = Registry(
    "placement kind", BUILT_IN, lambda module, name: getattr(module, name.upper()), UnknownPlacement
)


def register(kind: PlacementKind) -> PlacementKind:
    """Make `kind` a `--placement` choice, a candidate of the planner and buildable by a run."""
    if not isinstance(kind, PlacementKind):
        raise TypeError(f"placement kind {getattr(kind, 'name', kind)!r}: not a PlacementKind")
    if kind.name == AUTO or not set(kind.tuned_by) <= set(SIZES):
        raise ValueError(f"placement kind {kind.name!r}: a reserved name or an unknown size")
    return _kinds.register(kind.name, kind)


def unregister(name: str) -> None:
    _kinds.unregister(name)


def kind_names() -> tuple[str, ...]:
    """The kinds, built-in ones first."""
    return _kinds.names()


def placement_kind(name: str) -> PlacementKind:
    """The kind named `name`; UnknownPlacement (a KeyError) naming the kinds there are."""
    return _kinds.get(name)


def all_kinds() -> list[PlacementKind]:
    return [placement_kind(n) for n in kind_names()]


class _Choices(Mapping):
    """`--placement`'s choices, {value: what it means}, read from the registry whenever read:
    a kind registered after the settings were imported is a choice too."""

    def __getitem__(self, name: str) -> str:
        if name == AUTO:
            return AUTO_HELP
        try:
            return placement_kind(name).help
        except UnknownPlacement:
            raise KeyError(name) from None

    def __iter__(self) -> Iterator[str]:
        return iter((*kind_names(), AUTO))

    def __len__(self) -> int:
        return len(kind_names()) + 1


CHOICES: Mapping[str, str] = _Choices()

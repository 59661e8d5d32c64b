"""Model kinds: one registered `ModelKind` per model (`--model dlrm`, `--model tbsm`, ...) that
answers every question the run, checkpoints and serving used to ask by the model's name: how it
is built from the settings, the data each label comes with, what its checkpoint signature holds,
where its tables sit in its state dict, how messages name it.

A new kind is its module, defining `KIND = ModelKind(...)` next to its model, plus one line in
`BUILT_IN` (or a `register(kind)` call, as a test's toy kind does).

No torch here: `--help` lists `--model`'s choices and must not import it, so a built-in kind's
module is imported only when the kind is first asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hybrid_dlrm.common.registry import Registry

if TYPE_CHECKING:
    from dlrm.models.contract import RecModel

# name -> the module defining its KIND
BUILT_IN: dict[str, str] = {"dlrm": "dlrm.models.dlrm", "tbsm": "dlrm.models.tbsm"}
# the kind of a checkpoint whose signature names none (written before TBSM existed)
DEFAULT = "dlrm"
LAYOUTS = ("candidate", "sequence")


def one_row(cfg: Any) -> int:
    return 1


@dataclass(frozen=True)
class ModelKind:
    """A model kind. `cfg` below is the run's TrainConfig; a kind reads only its sections."""

    # --model's value, and the "model" of checkpoint signatures and artifact manifests
    name: str
    # how messages name it ("a TBSM model reads Taobao data")
    title: str
    # its architecture, a frozen dataclass (dlrm/models/contract.py ModelArch): artifacts hold
    # its fields as JSON, and an architecture's type says its kind
    arch_class: type
    # model_class(arch, embeddings, seed=...) -> RecModel: the trained model around float tables
    # and its quantized form around quantized ones
    model_class: Callable[..., RecModel]
    # (cfg, num_dense, num_sparse) -> arch; raises ArchError naming the field that is wrong
    arch_from_settings: Callable[[Any, int, int], Any]
    # (a checkpoint's `arch` signature, num_sparse) -> arch: export rebuilds the trained model
    arch_from_signature: Callable[[dict, int], Any]
    # settings (flat names) beyond the common architecture that must match for a checkpoint to
    # load (TrainConfig.arch_signature); the values arch_from_signature reads
    signature_fields: tuple[str, ...] = ()
    # the data each label comes with: `candidate` (its one row) or `sequence` (history steps,
    # then the candidate: Taobao windows), in data_pipeline/taobao_dataset.py's words
    layout: str = "candidate"
    # rows of dense and sparse features per label (a KJT batch of B labels has B * this rows)
    rows_per_sample: Callable[[Any], int] = one_row
    # where its tables sit in its state dict: `model.get_submodule(prefix[:-1])` is its
    # `embeddings`, which serving reads and replaces there
    embedding_prefix: str = "embeddings."

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"model kind {self.name}: layout must be one of {LAYOUTS}")
        # serving tells a model's table keys from its dense ones by that module name
        if not self.embedding_prefix.endswith("embeddings."):
            raise ValueError(f"model kind {self.name}: tables must sit under an `embeddings.`")


class UnknownModelKind(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


_kinds: Registry[ModelKind] = Registry(
    "model kind", BUILT_IN, lambda module, name: module.KIND, UnknownModelKind
)


def register(kind: ModelKind) -> ModelKind:
    """Make `kind` a `--model` choice (and readable in checkpoints and artifacts)."""
    return _kinds.register(kind.name, kind)


def unregister(name: str) -> None:
    _kinds.unregister(name)


def kind_names() -> tuple[str, ...]:
    """`--model`'s choices, built-in ones first."""
    return _kinds.names()


class _KindNames(Sequence[str]):
    """`kind_names()` as a sequence that reads the registry whenever it is read: `--model`'s
    choices, listed by `--help` and checked when a config is made, so a kind registered after
    the settings were imported is a choice too."""

    def __getitem__(self, i):  # type: ignore[override]
        return kind_names()[i]

    def __len__(self) -> int:
        return len(kind_names())


KIND_NAMES: Sequence[str] = _KindNames()


def model_kind(name: str) -> ModelKind:
    """The kind named `name`; UnknownModelKind (a KeyError) naming the kinds there are."""
    return _kinds.get(name)


def kind_of(arch: Any) -> ModelKind:
    """The kind whose architecture `arch` is."""
    for name in kind_names():
        kind = model_kind(name)
        if type(arch) is kind.arch_class:
            return kind
    raise UnknownModelKind(f"no model kind has the architecture {type(arch).__name__}")

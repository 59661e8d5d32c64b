"""From a configuration and a data set to a model on a device: what training, evaluation and an
inference tool all need, without a Trainer."""

from __future__ import annotations

import torch

from dlrm.config import SETTINGS, TrainConfig
from dlrm.data import DataSplits
from dlrm.errors import ArchError, ConfigError
from dlrm.models.contract import RecModel
from dlrm.models.kinds import model_kind
from dlrm.placement.build_collection import build_embeddings
from dlrm.placement.run_plan import PlacedEmbeddings
from embeddings import tables_for_features

# the command-line flag of each architecture field not named as its setting, for messages
ARCH_FLAGS = {
    "bottom": "--arch-mlp-bot", "top": "--arch-mlp-top", "interaction": "--arch-interaction-op",
    "embedding_dim": "--arch-sparse-feature-size",
}  # fmt: skip
_FLAG_OF_SETTING = {f.metadata["name"]: f.metadata["flag"] for f in SETTINGS}


def arch_flag(field: str) -> str:
    """The flag of an architecture field: a kind's own fields are named as their settings."""
    return ARCH_FLAGS.get(field) or _FLAG_OF_SETTING.get(field, field)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is available")
    return torch.device(name)


def table_sizes(cfg: TrainConfig, data: DataSplits) -> list[int]:
    """The data set's table sizes, or `--arch-embedding-size` when given (never smaller)."""
    sizes = list(data.table_sizes)
    if cfg.arch.embedding_size is None:
        return sizes
    given = list(cfg.arch.embedding_size)
    if len(given) != len(sizes):
        raise ConfigError(
            f"--arch-embedding-size: {len(given)} tables given, the data set has {len(sizes)} sparse features"
        )
    small = [i for i, (g, n) in enumerate(zip(given, sizes)) if g < n]
    if small:
        i = small[0]
        why = ""
        if "arch_embedding_size" in getattr(cfg, "reference_defaults", {}):
            # terabyte-dcn.toml: MLPerf's counts, which only the real days renumbered fit
            why = (" (the reference recipe's sizes count MLPerf's renumbered ids of the real "
                   "days, --contiguous-ids: docs/data.md#multi-hot-bags)")  # fmt: skip
        raise ConfigError(
            f"--arch-embedding-size: table {i} has {given[i]} rows but the data set's ids need {sizes[i]}{why}"
        )
    return given


def build_placed_embeddings(
    cfg: TrainConfig, data: DataSplits, device: torch.device, world_size: int = 1
) -> PlacedEmbeddings:
    tables = tables_for_features(
        table_sizes(cfg, data), cfg.arch.sparse_feature_size, data.feature_names
    )
    if world_size > 1:  # tables sharded across the process group (torchrec)
        from dlrm.processes.distributed import sharded_embeddings

        return sharded_embeddings(cfg, tables, device)
    return build_embeddings(cfg, tables, data.train, device)  # --placement


def build_model(
    cfg: TrainConfig,
    data: DataSplits,
    device: torch.device,
    embeddings: torch.nn.Module | None = None,
) -> RecModel:
    """The model `cfg` describes, around `embeddings` (built from `--placement` when None)."""
    kind = model_kind(cfg.arch.model)
    try:
        arch = kind.arch_from_settings(cfg, data.num_dense, len(data.table_sizes))
    except ArchError as e:
        raise ConfigError(f"{arch_flag(e.field)}: {e.reason}") from None
    if embeddings is None:
        embeddings = build_placed_embeddings(cfg, data, device).collection
    return kind.model_class(arch, embeddings, seed=cfg.training.seed).to(device)

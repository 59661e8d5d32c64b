"""From a configuration and a data set to a model on a device: what training, evaluation and an
inference tool all need, without a Trainer."""

from __future__ import annotations

import torch

from dlrm.config import TrainConfig
from dlrm.data import DataSplits
from dlrm.errors import ArchError, ConfigError
from dlrm.models.dlrm import DLRM, DLRMArch
from dlrm.models.tbsm import TBSM, TBSMArch
from dlrm.placement.build_collection import build_embeddings
from dlrm.placement.run_plan import PlacedEmbeddings
from embeddings import tables_for_features

# the command-line flag of each architecture field, for messages
ARCH_FLAGS = {
    "bottom": "--arch-mlp-bot", "top": "--arch-mlp-top", "interaction": "--arch-interaction-op",
    "embedding_dim": "--arch-sparse-feature-size", "model_type": "--model-type", "tsl_inner": "--tsl-inner",
    "tsl_mechanism": "--tsl-mechanism", "arch_mlp": "--arch-mlp", "ts_length": "--ts-length",
    "tsl_num_heads": "--tsl-num-heads", "mha_num_heads": "--mha-num-heads", "rnn_num_layers": "--rnn-num-layers",
    "dcn_num_layers": "--dcn-num-layers", "dcn_low_rank_dim": "--dcn-low-rank-dim",
}  # fmt: skip


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
        raise ConfigError(
            f"--arch-embedding-size: table {i} has {given[i]} rows but the data set's ids need {sizes[i]}"
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
) -> DLRM | TBSM:
    """The model `cfg` describes, around `embeddings` (built from `--placement` when None)."""
    num_sparse = len(data.table_sizes)
    common = dict(
        num_dense=data.num_dense, embedding_dim=cfg.arch.sparse_feature_size, num_sparse=num_sparse,
        bottom=cfg.arch.mlp_bot, top=cfg.arch.mlp_top, interaction=cfg.arch.interaction_op,
        interaction_itself=cfg.arch.interaction_itself, dcn_num_layers=cfg.arch.dcn_num_layers,
        dcn_low_rank_dim=cfg.arch.dcn_low_rank_dim,
    )  # fmt: skip
    try:
        if cfg.arch.model == "tbsm":
            arch = TBSMArch(
                **common, ts_length=cfg.tbsm.ts_length, model_type=cfg.tbsm.model_type, tsl_inner=cfg.tbsm.tsl_inner,
                tsl_mechanism=cfg.tbsm.tsl_mechanism, tsl_num_heads=cfg.tbsm.tsl_num_heads, tsl_mlp=cfg.tbsm.tsl_mlp,
                arch_mlp=cfg.tbsm.arch_mlp, tsl_proj=cfg.tbsm.tsl_proj, mha_num_heads=cfg.tbsm.mha_num_heads,
                rnn_num_layers=cfg.tbsm.rnn_num_layers,
            )  # fmt: skip
        else:
            arch = DLRMArch(**common)
    except ArchError as e:
        raise ConfigError(f"{ARCH_FLAGS.get(e.field, e.field)}: {e.reason}") from None
    if embeddings is None:
        embeddings = build_placed_embeddings(cfg, data, device).collection
    model_class = TBSM if cfg.arch.model == "tbsm" else DLRM
    return model_class(arch, embeddings, seed=cfg.training.seed).to(device)

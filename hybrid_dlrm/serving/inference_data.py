"""What export, the precision search and the accuracy monitor read: a trained model's source
(a run directory's newest checkpoint, or a checkpoint or `--save-model` file), data to
calibrate or compare on, and the categorical mapping raw values went through in training.

A model file carries the architecture but not the run's data settings; a checkpoint carries both
(its `config`). Where the data cannot be found from the source, the caller names it (`--data`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torchrec.datasets.utils import Batch

from dlrm.checkpoints import format as ckpt
from dlrm.checkpoints import store as checkpoint_store
from dlrm.errors import ArchError, CheckpointError, ConfigError
from dlrm.models.kinds import DEFAULT, UnknownModelKind, kind_of, model_kind
from embeddings.config import TableSpec
from hybrid_dlrm.common.manifest import sha256_file
from hybrid_dlrm.serving.tiered_source import is_tiered, tiered_tables

log = logging.getLogger(__name__)


@dataclass
class Source:
    """A trained model: its float weights, architecture, tables and run settings (if known)."""

    path: Path  # the checkpoint or model file read
    arch: Any  # its kind's architecture (dlrm/models/kinds.py)
    tables: list[TableSpec]
    state: dict[str, torch.Tensor]
    config: dict | None  # the run's config.json fields (checkpoints), None for model files
    step: int | None

    def sha256(self) -> str:
        return sha256_file(self.path)


def _newest_verified(directory: Path) -> tuple[Path, dict]:
    folder = directory / "checkpoints"
    if not ckpt.list_checkpoints(folder) and ckpt.list_checkpoints(directory):
        folder = directory
    skipped = []
    for path in reversed(ckpt.list_checkpoints(folder)):
        try:
            return path, checkpoint_store.read(path)
        except CheckpointError as e:
            skipped.append(str(e))
            log.warning("skipping %s", e)
    why = f" ({'; '.join(skipped)})" if skipped else ""
    raise CheckpointError(f"{directory}: no checkpoint that verifies{why}")


def load_source(where: str | Path) -> Source:
    """A run directory (its newest checkpoint that verifies), a checkpoint or a model file."""
    where = Path(where)
    if where.is_dir():
        path, data = _newest_verified(where)
    elif where.is_file():
        path, data = where, checkpoint_store.read(where)
    else:
        raise CheckpointError(f"{where}: no such run directory, checkpoint or model file")
    sig = data.get("arch") or {}
    state = data["model"]
    try:
        kind = model_kind(sig.get("model", DEFAULT))
    except UnknownModelKind as e:
        raise CheckpointError(f"{path}: {e}") from None
    prefix = kind.embedding_prefix
    if is_tiered(state, prefix):  # the cold rows are in the run's SSD tier, not the checkpoint
        state = {k: v for k, v in state.items() if not k.startswith(f"{prefix}tiered.")}
        state.update(tiered_tables(path, data, prefix))
    weights = [(k, v) for k, v in state.items() if k.startswith(prefix) and k.endswith(".weight")]
    if not weights:
        raise CheckpointError(f"{path}: holds no embedding tables under {prefix!r}")
    tables = []
    for key, w in weights:
        name = key[len(prefix) : -len(".weight")]
        feature = name[2:] if name.startswith("t_") else name  # embeddings.tables_for_features
        tables.append(TableSpec(name, int(w.shape[0]), int(w.shape[1]), feature))
    try:
        arch = kind.arch_from_signature(sig, len(tables))
    except (ArchError, KeyError, TypeError) as e:
        raise CheckpointError(
            f"{path}: its architecture is incomplete or inconsistent ({e})"
        ) from None
    step = data["train_state"]["step"] if "train_state" in data else None
    return Source(path, arch, tables, state, data.get("config"), step)


# --- data ----------------------------------------------------------------------------------------


class BatchList:
    """Batches held in memory, with the face of a BatchSource (what evaluate() reads)."""

    def __init__(self, batches: list[Batch]) -> None:
        self.items = batches

    def __len__(self) -> int:
        return len(self.items)

    def batches(self, epoch: int = 0, start: int = 0) -> Iterator[Batch]:
        return iter(self.items[start:])

    @property
    def samples(self) -> int:
        return sum(int(b.labels.numel()) for b in self.items)


def _data_dir(config: dict) -> Path:
    if config["data_set"] == "taobao":
        return Path(
            config.get("processed_data_file")
            or f"{config['raw_data_file']}.t{config['ts_length']}_p{config['points_per_user']}.processed"
        )
    return Path(config.get("processed_data_file") or f"{config['raw_data_file']}.processed")


def data_source(source: Source, data: str | None, split: str, batch_size: int):
    """A split of `data` (a preprocessed Criteo or Taobao directory), or of the source run's own
    data set when `data` is None (its synthetic world, or its preprocessed directory)."""
    kind = kind_of(source.arch)
    if data is None:
        cfg = source.config
        if cfg is None:
            raise ConfigError(
                f"--data: {source.path} is a model file without its run's settings; name the "
                "preprocessed data set to use"
            )
        if cfg["data_set"] == "synthetic":
            from data_pipeline.synthetic import PlantedWorld, SyntheticBatchSource, SyntheticConfig

            sizes = [t.num_embeddings for t in source.tables]
            world = PlantedWorld(SyntheticConfig(table_sizes=sizes, zipf_alpha=cfg["synthetic_zipf"],
                                                 seed=cfg["seed"],
                                                 multi_hot_sizes=_bag_sizes(cfg, len(sizes))))  # fmt: skip
            size = cfg["test_data_size"]
            return SyntheticBatchSource(world, split, batch_size, math.ceil(size / batch_size))
        directory = _data_dir(cfg)
    else:
        directory = Path(data)
    if not (directory / "meta.json").is_file():
        raise ConfigError(f"--data: {directory} is not a preprocessed data set (no meta.json)")
    import json

    dataset = json.loads((directory / "meta.json").read_text()).get("dataset")
    if dataset == "taobao":
        from data_pipeline.taobao_dataset import TaobaoBatchSource, TaobaoDataset

        return TaobaoBatchSource(TaobaoDataset(directory), split, batch_size, layout=kind.layout)
    if kind.layout == "sequence":
        raise ConfigError(
            f"--data: {directory} holds {dataset} data; a {kind.title} model reads Taobao data"
        )
    from data_pipeline.criteo import CriteoBatchSource, CriteoDataset

    dataset = CriteoDataset(directory)
    return CriteoBatchSource(dataset, split, batch_size, bags=_bag_spec(source, dataset))


def _bag_sizes(cfg: dict, n_tables: int) -> list[int] | None:
    """The run's `--multi-hot-sizes` as training read them (dlrm/data.py bag_sizes); None for a
    one-hot run or a config from before multi-hot bags."""
    from types import SimpleNamespace

    from dlrm.data import bag_sizes

    sizes = cfg.get("multi_hot_sizes")
    return bag_sizes(
        SimpleNamespace(multi_hot_sizes=None if sizes is None else list(sizes)), n_tables
    )


def _bag_spec(source: Source, dataset):
    """A multi-hot run's bags on its Criteo data, so that calibration and comparison see what
    the model was trained on. Made batch by batch from the one-hot ids (the same bags a
    materialisation holds, dlrm/data.py _materialised_bags), so export writes nothing beside
    the data set. None for a one-hot run, a model file (no run settings) or other tables."""
    cfg = source.config
    if cfg is None or cfg.get("data_set") not in ("kaggle", "terabyte"):
        return None
    sizes = _bag_sizes(cfg, len(dataset.table_sizes))
    if sizes is None:
        return None
    from data_pipeline.multi_hot import BagSpec

    distribution = cfg.get("multi_hot_distribution", "uniform")
    return BagSpec(sizes, list(dataset.table_sizes), distribution, seed=0)


def take_batches(source, limit: int) -> BatchList:
    """The first `limit` batches of a split (0: all of them), in memory."""
    n = len(source) if limit <= 0 else min(limit, len(source))
    return BatchList([source.batch(0, i) for i in range(n)])


# --- the categorical mapping -------------------------------------------------------------------


def categorical_mapping(source: Source, data: str | None) -> tuple[dict | None, Path | None]:
    """How raw Criteo values become row ids in training: ({"mode": "hash", "max_ind_range": M}
    (with "contiguous": True where renumbered) or {"mode": "frequency", "threshold": T}, the
    vocabulary directory in frequency mode and renumbered hash mode);
    (None, None) when the model was not trained on Criteo data (nothing to map)."""
    from data_pipeline.dataset_meta import load_meta

    if data is not None:
        directory = Path(data)
    elif source.config is not None and source.config["data_set"] in ("kaggle", "terabyte"):
        directory = _data_dir(source.config)
    else:
        return None, None
    if not (directory / "meta.json").is_file():
        return None, None
    meta = load_meta(directory)
    if meta.get("dataset") not in ("kaggle", "terabyte"):
        return None, None
    sizes = [t.num_embeddings for t in source.tables]
    if len(sizes) != len(meta["table_sizes"]) or any(
        s < m for s, m in zip(sizes, meta["table_sizes"])
    ):
        raise ConfigError(
            f"--data: {directory} has tables of {meta['table_sizes']} rows; the model's "
            f"{sizes} cannot hold its ids"
        )
    cat = meta["categorical"]
    if cat["mode"] == "hash" and cat.get("contiguous"):  # value % M, then renumbered
        hashed = {"mode": "hash", "max_ind_range": int(cat["max_ind_range"]), "contiguous": True}
        return hashed, directory / cat["vocab_dir"]
    if cat["mode"] == "hash":
        return {"mode": "hash", "max_ind_range": int(cat["max_ind_range"])}, None
    return {"mode": "frequency", "threshold": int(cat["threshold"])}, directory / cat["vocab_dir"]

"""Turning a TrainConfig into batch sources (train and test splits) for the trainer."""

from __future__ import annotations

import math
from dataclasses import dataclass

from data_pipeline.source import BatchSource
from data_pipeline.synthetic import (
    PlantedWorld,
    SyntheticBatchSource,
    SyntheticConfig,
    scaled_table_sizes,
)
from dlrm.config import ConfigError, TrainConfig


@dataclass
class DataSplits:
    train: BatchSource
    test: BatchSource
    table_sizes: list[int]
    num_dense: int
    feature_names: list[str]


def build_data(cfg: TrainConfig, rank: int = 0, world_size: int = 1) -> DataSplits:
    if cfg.data_set == "synthetic":
        return _synthetic(cfg, rank, world_size)
    if cfg.data_set in ("kaggle", "terabyte"):
        return _criteo(cfg, rank, world_size)
    raise ConfigError(f"--data-set {cfg.data_set}: not available for --model {cfg.model}")


def _synthetic(cfg: TrainConfig, rank: int, world_size: int) -> DataSplits:
    sizes = list(cfg.arch_embedding_size or scaled_table_sizes(cfg.synthetic_table_scale))
    world = PlantedWorld(SyntheticConfig(table_sizes=sizes, zipf_alpha=cfg.synthetic_zipf, seed=cfg.seed))
    train = SyntheticBatchSource(
        world, "train", cfg.mini_batch_size, math.ceil(cfg.data_size / cfg.mini_batch_size), rank, world_size
    )
    test = SyntheticBatchSource(
        world, "test", cfg.eval_batch_size, math.ceil(cfg.test_data_size / cfg.eval_batch_size), rank, world_size
    )
    return DataSplits(train, test, sizes, world.cfg.num_dense, list(world.feature_names))


def _criteo(cfg: TrainConfig, rank: int, world_size: int) -> DataSplits:
    try:
        from data_pipeline import criteo  # noqa: F401  (the Criteo pipeline, issue 3)
    except ImportError:
        raise ConfigError(f"--data-set {cfg.data_set}: the Criteo pipeline is not installed") from None
    raise ConfigError(f"--data-set {cfg.data_set}: not wired into the trainer yet")

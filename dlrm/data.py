"""Turning a TrainConfig into batch sources (train and test splits) for the trainer."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from torchrec.datasets.utils import Batch

from data_pipeline.bag_memory import check_bags
from data_pipeline.source import BatchSource
from data_pipeline.synthetic import (
    CHUNK,
    PlantedWorld,
    SyntheticBatchSource,
    SyntheticConfig,
    scaled_table_sizes,
)
from data_pipeline.synthetic import MAX_ROWS as SYNTHETIC_MAX_ROWS
from dlrm.config import ConfigError, TrainConfig
from dlrm.models.kinds import model_kind
from dlrm.settings.sections import DataConfig


@dataclass
class DataSplits:
    """What a run trains and evaluates on (`Trainer(cfg, data=...)`): built from the config, or
    from a user's own batches with `DataSplits.from_batches`."""

    train: BatchSource
    test: BatchSource
    table_sizes: list[int]
    num_dense: int
    feature_names: list[str]

    @classmethod
    def from_batches(
        cls, train: Iterable[Batch], test: Iterable[Batch], table_sizes: Sequence[int]
    ) -> DataSplits:
        """A training and a test iterable of torchrec `Batch` (dlrm/user_data.py)."""
        from dlrm.user_data import splits_from_batches

        return splits_from_batches(cls, train, test, table_sizes)


def steps_per_epoch(cfg: TrainConfig, data: DataSplits) -> int:
    n = len(data.train)
    return min(n, cfg.training.num_batches) if cfg.training.num_batches else n


def build_data(cfg: TrainConfig, rank: int = 0, world_size: int = 1) -> DataSplits:
    if cfg.data.data_set == "taobao":
        return _taobao(cfg, rank, world_size)
    if model_kind(cfg.arch.model).layout == "sequence":
        raise ConfigError(
            f"--model {cfg.arch.model}: needs --data-set taobao (user event sequences), "
            f"got {cfg.data.data_set}"
        )
    if cfg.data.data_set == "synthetic":
        return _synthetic(cfg, rank, world_size)
    if cfg.data.data_set in ("kaggle", "terabyte"):
        return _criteo(cfg, rank, world_size)
    raise ConfigError(f"--data-set {cfg.data.data_set}: not available for --model {cfg.arch.model}")


def bag_sizes(data: DataConfig, n_tables: int) -> list[int] | None:
    """`--multi-hot-sizes` for `n_tables` features (one number: every feature); None for one id
    per feature, which bags of one id each are too: one-hot data stays the one-hot path."""
    sizes = data.multi_hot_sizes
    if sizes is None:
        return None
    if len(sizes) == 1:
        sizes = sizes * n_tables
    if len(sizes) != n_tables:
        raise ConfigError(
            f"--multi-hot-sizes: expected one size per categorical feature ({n_tables}) or one "
            f"for all, got {len(sizes)}"
        )
    return None if max(sizes) == 1 else list(sizes)


def _synthetic(cfg: TrainConfig, rank: int, world_size: int) -> DataSplits:
    sizes = list(cfg.arch.embedding_size or scaled_table_sizes(cfg.data.synthetic_table_scale))
    if max(sizes) > SYNTHETIC_MAX_ROWS:
        raise ConfigError(
            f"--arch-embedding-size: a table of {max(sizes)} rows; synthetic tables hold at most "
            f"{SYNTHETIC_MAX_ROWS} (2**31 - 1)"
        )
    bags = bag_sizes(cfg.data, len(sizes))
    if bags is not None:  # before the generator makes a chunk of them
        check_bags("--multi-hot-sizes", bags, CHUNK, "a chunk of synthetic samples",
                   cfg.placing.memory_bytes())  # fmt: skip
    world = PlantedWorld(
        SyntheticConfig(
            table_sizes=sizes, zipf_alpha=cfg.data.synthetic_zipf, seed=cfg.training.seed,
            multi_hot_sizes=bags,
        )
    )  # fmt: skip
    train = SyntheticBatchSource(
        world,
        "train",
        cfg.training.mini_batch_size,
        math.ceil(cfg.data.data_size / cfg.training.mini_batch_size),
        rank,
        world_size,
    )
    test = SyntheticBatchSource(
        world,
        "test",
        cfg.eval_batch_size,
        math.ceil(cfg.data.test_data_size / cfg.eval_batch_size),
        rank,
        world_size,
    )
    return DataSplits(train, test, sizes, world.cfg.num_dense, list(world.feature_names))


def _criteo(cfg: TrainConfig, rank: int, world_size: int) -> DataSplits:
    """Kaggle / Terabyte: preprocess the raw files on first use, then read the memory-mapped days."""
    from data_pipeline.criteo import CriteoBatchSource, CriteoDataset, ensure_preprocessed

    directory = Path(cfg.data.processed_data_file or f"{cfg.data.raw_data_file}.processed")
    if cfg.data.raw_data_file:
        options = {
            "max_ind_range": cfg.data.max_ind_range if (cfg.data.max_ind_range or 0) > 0 else None,
            "contiguous_ids": bool(cfg.data.contiguous_ids),
            "frequency_threshold": cfg.data.frequency_threshold
            if cfg.data.frequency_threshold > 0
            else None,
            "sub_sample_rate": cfg.data.data_sub_sample_rate,
            "seed": cfg.training.seed,
            "on_bad_line": cfg.data.on_bad_line,
            "progress": cfg.run.progress,
        }
        directory = ensure_preprocessed(
            cfg.data.data_set, cfg.data.raw_data_file, directory, **options
        )
    elif not (directory / "meta.json").is_file():
        raise ConfigError(
            f"--processed-data-file: {directory} is not a preprocessed data set (no meta.json)"
        )
    dataset = CriteoDataset(directory)
    made_from = dataset.meta.get("dataset")
    if made_from != cfg.data.data_set:
        raise ConfigError(
            f"--processed-data-file: {directory} holds {made_from} data, not {cfg.data.data_set}"
        )
    bags = _materialised_bags(cfg, directory, dataset.table_sizes)
    train = CriteoBatchSource(
        dataset, "train", cfg.training.mini_batch_size, randomize=cfg.data.data_randomize, seed=cfg.training.seed,
        rank=rank, world_size=world_size, bags=bags,
    )  # fmt: skip
    test = CriteoBatchSource(
        dataset, "test", cfg.eval_batch_size, rank=rank, world_size=world_size, bags=bags
    )
    return DataSplits(train, test, dataset.table_sizes, dataset.num_dense, dataset.feature_names)


def _materialised_bags(cfg: TrainConfig, directory: Path, table_sizes: list[int]):
    """`--multi-hot-sizes` on Criteo: the bags materialised once beside the preprocessed
    directory (`DIR.multihot-DIST-TAG`, data_pipeline/multi_hot.py) and reused; every rank makes
    or waits for the same one. The materialisation seed is fixed (0), as the reference's: the
    bags are the data, not the run's randomness, so runs with other seeds share them. With
    `--multi-hot-materialize false` the loader makes the same bags batch by batch instead."""
    sizes = bag_sizes(cfg.data, len(table_sizes))
    if sizes is None:
        return None
    from data_pipeline.multi_hot import (
        BLOCK_ROWS,
        BagSpec,
        MultiHotDataset,
        default_directory,
        materialise,
    )  # fmt: skip

    if cfg.data.multi_hot_materialize:  # before the spec and the blocks are made
        check_bags("--multi-hot-sizes", sizes, BLOCK_ROWS, "materialising the bags",
                   cfg.placing.memory_bytes())  # fmt: skip
    spec = BagSpec(sizes, table_sizes, cfg.data.multi_hot_distribution, seed=0)
    if not cfg.data.multi_hot_materialize:
        return spec  # the loader makes each batch's bags: the same ones, nothing on disk
    return MultiHotDataset(materialise(directory, default_directory(directory, spec), spec))


def _taobao(cfg: TrainConfig, rank: int, world_size: int) -> DataSplits:
    """Taobao UserBehavior: windows of ts_length events plus a candidate, preprocessed on first
    use. `--model tbsm` gets every step (KJT batch B*(ts_length+1)), `--model dlrm` only the
    candidate step (the baseline TBSM must beat). Training reads `train`, evaluation `test`."""
    from data_pipeline.taobao import TaobaoOptions, preprocess_taobao
    from data_pipeline.taobao_dataset import TaobaoBatchSource, TaobaoDataset

    directory = Path(
        cfg.data.processed_data_file
        or f"{cfg.data.raw_data_file}.t{cfg.tbsm.ts_length}_p{cfg.tbsm.points_per_user}.processed"
    )
    if cfg.data.raw_data_file:
        options = TaobaoOptions(
            ts_length=cfg.tbsm.ts_length, points_per_user=cfg.tbsm.points_per_user, seed=0,
            on_bad_line=cfg.data.on_bad_line, progress=cfg.run.progress,
        )  # fmt: skip
        directory = preprocess_taobao(cfg.data.raw_data_file, directory, options)
    elif not (directory / "meta.json").is_file():
        raise ConfigError(
            f"--processed-data-file: {directory} is not a preprocessed data set (no meta.json)"
        )
    dataset = TaobaoDataset(directory)
    if dataset.ts_length != cfg.tbsm.ts_length:
        raise ConfigError(
            f"--ts-length {cfg.tbsm.ts_length}: {directory} was made with --ts-length {dataset.ts_length}"
        )
    layout = model_kind(cfg.arch.model).layout
    train = TaobaoBatchSource(
        dataset, "train", cfg.training.mini_batch_size, layout=layout, randomize=cfg.data.data_randomize != "none",
        seed=cfg.training.seed, rank=rank, world_size=world_size,
    )  # fmt: skip
    test = TaobaoBatchSource(
        dataset, "test", cfg.eval_batch_size, layout=layout, rank=rank, world_size=world_size
    )
    return DataSplits(train, test, dataset.table_sizes, 1, dataset.feature_names)

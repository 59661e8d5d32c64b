"""The Criteo Kaggle / Terabyte pipeline: what the trainer and users call.

    ensure_preprocessed("kaggle", "raw/train.txt", "processed/kaggle", sub_sample_rate=0.0)
    train = CriteoBatchSource("processed/kaggle", "train", 128, randomize="total", seed=1)
    for batch in train.batches(epoch=0, start=0): ...

See preprocess.py (options, resumption), dataset_meta.py (directory layout), criteo_directory.py
(an opened directory) and criteo_dataset.py (batch order, sharding).
"""

from __future__ import annotations

from .criteo_dataset import RANDOMIZE, CriteoBatchSource
from .criteo_directory import CriteoDataset
from .criteo_format import DENSE_NAMES, FEATURE_NAMES, NUM_DENSE, NUM_SPARSE, SPARSE_NAMES
from .dataset_meta import load_meta
from .preprocess import PreprocessOptions, ensure_preprocessed, preprocess

__all__ = [
    "CriteoBatchSource",
    "CriteoDataset",
    "DENSE_NAMES",
    "FEATURE_NAMES",
    "NUM_DENSE",
    "NUM_SPARSE",
    "PreprocessOptions",
    "RANDOMIZE",
    "SPARSE_NAMES",
    "ensure_preprocessed",
    "load_meta",
    "preprocess",
]

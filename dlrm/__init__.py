"""hybrid-dlrm: DLRM/TBSM training with skew-aware tiered embeddings.

    from dlrm import Trainer, TrainConfig
    summary = Trainer(TrainConfig(num_batches=100, out_dir="runs/demo")).fit()
"""

from dlrm.config import ConfigError, TrainConfig
from dlrm.trainer import Trainer

__all__ = ["ConfigError", "TrainConfig", "Trainer"]

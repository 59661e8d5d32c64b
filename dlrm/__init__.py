"""hybrid-dlrm: DLRM/TBSM training with skew-aware tiered embeddings.

    from dlrm import Trainer, TrainConfig
    summary = Trainer(TrainConfig(num_batches=100, out_dir="runs/demo")).fit()

    from dlrm import Predictor
    probabilities = Predictor.load("artifacts/model-int8").predict(batch)

`Trainer` and `Predictor` are imported on first use: parsing a command line (`dlrm.train`, `dlrm.config`) must not
pay for importing torchrec and fbgemm.
"""

from dlrm.config import TrainConfig
from dlrm.errors import ConfigError

__all__ = ["ConfigError", "Predictor", "TrainConfig", "Trainer"]


def __getattr__(name: str):
    if name == "Trainer":
        from dlrm.trainer import Trainer

        return Trainer
    if name == "Predictor":
        from dlrm.predictor import Predictor

        return Predictor
    raise AttributeError(f"module 'dlrm' has no attribute {name!r}")

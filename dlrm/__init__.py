"""hybrid-dlrm: DLRM/TBSM training with skew-aware tiered embeddings.

    from dlrm import Trainer, TrainConfig
    summary = Trainer(TrainConfig(num_batches=100, out_dir="runs/demo")).fit()

`Trainer` and `DataSplits` (a user's own batches, `DataSplits.from_batches`) are imported on
first use: parsing a command line (`dlrm.train`, `dlrm.config`) must not
pay for importing torchrec and fbgemm. Serving a trained model (`Predictor`) is the `hybrid_dlrm.serving`
package, which builds on this one.
"""

from hybrid_dlrm.common.stack import require

require("dlrm")  # before anything imports torch: one line, not a traceback

from dlrm.config import TrainConfig  # noqa: E402 (after the check above)
from dlrm.errors import ConfigError  # noqa: E402

__all__ = ["ConfigError", "DataSplits", "TrainConfig", "Trainer"]


def __getattr__(name: str):
    if name == "Trainer":
        from dlrm.trainer import Trainer

        return Trainer
    if name == "DataSplits":  # a user's own batches: DataSplits.from_batches(train=, test=, ...)
        from dlrm.data import DataSplits

        return DataSplits
    raise AttributeError(f"module 'dlrm' has no attribute {name!r}")

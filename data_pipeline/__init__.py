"""Raw files to batches: preprocessing, datasets, synthetic data (docs/data.md)."""

from hybrid_dlrm.common.stack import require

require("data_pipeline")  # before anything imports torch: one line, not a traceback

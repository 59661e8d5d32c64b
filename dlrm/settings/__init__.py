"""Settings per capability: one dataclass section each (model, TBSM, data, training, placement
with its FAE / Hotline / SSD-tier parts, Slipstream, distributed, run), every field one flag
with its metadata (fields.py). `dlrm.config.TrainConfig` holds the sections."""

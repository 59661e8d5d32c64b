"""What every package of hybrid-dlrm repeats, written once: the CRC (`crc`), the atomic write
(`atomic`), the format-header check (`header`) and the per-file checksum manifest (`manifest`).

The bottom layer: it imports nothing of this project (tests/test_layers.py checks the order
common <- data_pipeline <- embeddings <- dlrm <- {serving, perfmodel, scripts}).
"""

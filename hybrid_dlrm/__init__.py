"""hybrid-dlrm's own packages whose plain names a user's environment may already hold:
`hybrid_dlrm.common` (the bottom layer: CRC, atomic writes, headers, manifests, locks) and
`hybrid_dlrm.serving` (the top: quantized export, artifacts, the Predictor). `dlrm`,
`embeddings` and `data_pipeline` keep the names facebookresearch/dlrm's users know.

Importing this package imports nothing else.
"""

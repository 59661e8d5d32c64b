"""Serving a trained model: quantized export, precision search, verified artifacts, the Predictor
and `python -m hybrid_dlrm.serving.predict`. Built on the models (dlrm) and the collections (embeddings);
neither of them imports serving.

    from hybrid_dlrm.serving import Predictor
    probabilities = Predictor.load("artifacts/model-int8").predict(batch)

`Predictor` is imported on first use: `import hybrid_dlrm.serving` costs nothing until it is needed.
"""

from hybrid_dlrm.common.stack import require

require("hybrid_dlrm.serving")  # before anything imports torch: one line, not a traceback

__all__ = ["Predictor"]


def __getattr__(name: str):
    if name == "Predictor":
        from hybrid_dlrm.serving.predictor import Predictor

        return Predictor
    raise AttributeError(f"module 'serving' has no attribute {name!r}")

"""Train pipelines: the training step as an object with one face, `progress(batches)`, as in
torchrec's `train_pipeline/`. A collection's declared abilities choose the pipeline, never a
kind string.

- `base`: the contract (`TrainPipeline`, `StepResult`, `StepHook`) and the plain step;
- `staging`: Hotline's, cold rows staged on a worker ahead of the step;
- `slipstream` and `slipstream_inputs`: Slipstream's skipping of stale rows and inputs;
- `dense_step` and `compile`: the dense step written out, and `--compile`;
- `fae_batches`: FAE's schedule of hot and cold mini-batches over a training split;
- `step_hooks`: hooks that packages above `dlrm` register for a setting (`--perf-log`).
"""

from hybrid_dlrm.common.lazy import lazy_exports

_HOME = {
    "TrainPipeline": "dlrm.pipelines.base",
    "PlainTrainPipeline": "dlrm.pipelines.base",
    "StepResult": "dlrm.pipelines.base",
    "StepHook": "dlrm.pipelines.base",
    "StepHooks": "dlrm.pipelines.base",
    "loss_of": "dlrm.pipelines.base",
    "HotlineTrainPipeline": "dlrm.pipelines.staging",
    "SlipstreamTrainPipeline": "dlrm.pipelines.slipstream",
    "WrittenDenseStep": "dlrm.pipelines.dense_step",
    "FAEBatchSource": "dlrm.pipelines.fae_batches",
}

__all__ = sorted(_HOME)
__getattr__, __dir__ = lazy_exports(__name__, _HOME)

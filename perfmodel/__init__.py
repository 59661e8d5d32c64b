"""Built-in performance model after Lin et al. (2022): per-batch training time without training.

    from perfmodel import predict_step_time
    out = predict_step_time(cfg)                  # cfg: a dlrm.config.TrainConfig
    out["per_batch_us"], out["breakdown"]

Pieces: `trace` (the perf-trace JSON format), `profiling` (profiled, labelled steps), `recorder`
(`--perf-log`), `hardware` (measured machine description), `machine_cache` (where measurements
are cached, per machine), `sweeps` (kernel sweeps), `fit_traces` (the fit configurations' traces),
`microbench` (runs both), `kernel_models` (one model per operator type), `kernels` (their
collection and in-situ factors), `overheads` (the five host overheads), `graph` (the step's
execution graph at any batch size), `critical_path` (the traversal), `model` (fit/save/load),
`report` (predicted vs measured), `errors`. CLI: ``python -m perfmodel microbench|fit|predict|report``.
"""

from __future__ import annotations

import os

from hybrid_dlrm.common.lazy import lazy_exports
from hybrid_dlrm.common.stack import require

require("perfmodel")  # before anything imports torch: one line, not a traceback

# torch's profiler (kineto) prints two "USDT ... profiler_start/stop" lines to stderr for every
# profiled region; the model profiles steps to capture their graphs (a --placement auto run's
# planning among them), and a user would see pages of them. Level 6 is above its USDT messages;
# it is read when the profiler first starts, so setting it here, before any profile, is enough.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

__all__ = ["predict_step_time", "load_model"]
__getattr__, __dir__ = lazy_exports(__name__, {name: "perfmodel.model" for name in __all__})

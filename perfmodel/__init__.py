"""Built-in performance model after Lin et al. (2022): per-batch training time without training.

    from perfmodel import predict_step_time
    out = predict_step_time(cfg)                  # cfg: a dlrm.config.TrainConfig
    out["per_batch_us"], out["breakdown"]

Pieces: `trace` (the perf-trace JSON format), `recorder` (`--perf-log`), `hardware` (measured
machine description), `sweeps` (kernel sweeps), `fit_traces` (the fit configurations' traces),
`microbench` (runs both), `kernel_models` (one model per operator type), `kernels` (their
collection and in-situ factors), `overheads` (the five host overheads), `graph` (the step's
execution graph at any batch size), `critical_path` (the traversal), `model` (fit/save/load),
`report` (predicted vs measured), `errors`. CLI: ``python -m perfmodel microbench|fit|predict|report``.
"""

from __future__ import annotations

import os
from pathlib import Path

# torch's profiler (kineto) prints two "USDT ... profiler_start/stop" lines to stderr for every
# profiled region; the model profiles steps to capture their graphs (a --placement auto run's
# planning among them), and a user would see pages of them. Level 6 is above its USDT messages;
# it is read when the profiler first starts, so setting it here, before any profile, is enough.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

_LOADED: dict[str, object] = {}


def load_model(path: str | Path | None = None):
    """The fitted model (default: this machine's, under the cache directory), loaded once."""
    from perfmodel.model import PerfModel, default_model_path

    key = str(path or default_model_path())
    if key not in _LOADED:
        _LOADED[key] = PerfModel.load(key)
    return _LOADED[key]


def predict_step_time(
    cfg, batch_size: int | None = None, model_path: str | Path | None = None
) -> dict:
    """Predicted training time of one batch of `cfg` (a TrainConfig; placement, precision and
    architecture as configured) at `batch_size` (default the config's), in microseconds:
    ``per_batch_us``, ``host_us``, ``device_active_us`` per stream and a ``breakdown`` by phase,
    kernel type and overhead kind. The first call for an architecture captures its execution
    graph (two tiny profiled steps, cached); later calls take milliseconds."""
    return load_model(model_path).predict(cfg, batch_size)


__all__ = ["predict_step_time", "load_model"]

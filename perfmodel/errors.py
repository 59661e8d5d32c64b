"""The performance model's errors: each a one-line message naming the file and what is wrong
(the CLI prints it and exits 2)."""


class TraceError(ValueError):
    """A perf-trace (or kernel-record) file that is not in the documented format."""


class ModelError(ValueError):
    """A missing or unreadable model file, or a microbenchmark directory without records."""


class CalibrationOff(ModelError):
    """No fitted model on this machine, and calibration turned off (`HYBRID_DLRM_CALIBRATE`)."""

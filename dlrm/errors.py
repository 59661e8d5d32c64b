"""Errors that end a run with one clear line rather than a traceback."""


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the last good checkpoint is left untouched."""


class CheckpointError(ValueError):
    """A checkpoint that is missing, corrupt or does not fit the model."""

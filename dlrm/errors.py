"""Errors that end a run with one clear line rather than a traceback."""


class ConfigError(ValueError):
    """A user's mistake in the configuration: one line naming the flag and what was expected."""


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the last good checkpoint is left untouched."""


class NonFiniteLoss(ArithmeticError):
    """A step's loss was NaN or infinite; raised before backward, so nothing was updated. The
    trainer turns it into TrainingDiverged with where the run was."""

    def __init__(self, value: float) -> None:
        super().__init__(f"non-finite loss ({value})")
        self.value = value


class CheckpointError(ValueError):
    """A checkpoint that is missing, corrupt or does not fit the model."""


class ArchError(ValueError):
    """An inconsistent model architecture, naming the architecture field (`bottom`, `top`, ...)
    that is wrong. Models know fields, not command-line flags: the CLI's side translates."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason

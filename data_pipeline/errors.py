"""The one exception type for bad data or bad data options, and the record of a rejected line.

Its message is a single line naming the file (and line, where there is one) and what was expected;
the CLI prints it and exits with code 2.
"""

from dataclasses import dataclass


class DataError(ValueError):
    pass


@dataclass
class BadLine:
    """A rejected raw line: its 0-based index in the parsed block, why, and a one-line message."""

    index: int
    reason: str
    message: str

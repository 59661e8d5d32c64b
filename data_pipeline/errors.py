"""The one exception type for bad data or bad data options.

Its message is a single line naming the file (and line, where there is one) and what was expected;
the CLI prints it and exits with code 2.
"""


class DataError(ValueError):
    pass

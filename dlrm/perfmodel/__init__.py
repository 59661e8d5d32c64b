"""Deprecated alias of the top-level `perfmodel` package (`python -m perfmodel`); kept for a while
so existing command lines and imports keep working. Importing `dlrm` does not import this."""

from perfmodel import *  # noqa: F401,F403
from perfmodel import __all__  # noqa: F401

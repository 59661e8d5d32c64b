"""A package's public face without its import cost: each name lives in one module and is imported
from there on first use (PEP 562), so `import embeddings.config` (what a CLI needs to parse its
flags) does not pay for torchrec and fbgemm, and a face never makes an import cycle.

    __getattr__, __dir__ = lazy_exports(__name__, {"ScmTier": "embeddings.ssd.tier", ...})
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable


def lazy_exports(package: str, homes: dict[str, str]) -> tuple[Callable, Callable]:
    """The module-level `__getattr__` and `__dir__` of `package`, serving `homes` (name -> the
    dotted module that defines it)."""

    def __getattr__(name: str):
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        vars(sys.modules[package])[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(homes))

    return __getattr__, __dir__

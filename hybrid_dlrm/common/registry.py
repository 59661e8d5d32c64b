"""A registry of named kinds, the one mechanism behind `--model` and `--placement`: the built-in
kinds are imported on first use (listing the choices costs no import), a kind of the user's own
is registered from their code, and an unknown name is one error naming the kinds there are."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")


class Registry(Generic[K]):
    """Kinds by name. `built_in` maps a built-in kind's name to the module that defines it and
    `load(module, name)` finds it there; `unknown` is the KeyError raised for an unknown name."""

    def __init__(
        self, what: str, built_in: dict[str, str], load: Callable[[object, str], K],
        unknown: type[KeyError],
    ) -> None:  # fmt: skip
        self.what, self.built_in, self.load, self.unknown = what, built_in, load, unknown
        self._registered: dict[str, K] = {}

    def register(self, name: str, kind: K) -> K:
        known = self._registered.get(name)
        if known is not None and known is not kind:
            raise ValueError(f"{self.what} {name!r} is registered already")
        self._registered[name] = kind
        return kind

    def unregister(self, name: str) -> None:
        self._registered.pop(name, None)

    def names(self) -> tuple[str, ...]:
        """Built-in kinds first, then the others in the order they were registered."""
        return tuple(dict.fromkeys([*self.built_in, *self._registered]))

    def get(self, name: str) -> K:
        if name not in self._registered and name in self.built_in:
            self.register(name, self.load(importlib.import_module(self.built_in[name]), name))
        kind = self._registered.get(name)
        if kind is None:
            raise self.unknown(f"no {self.what} named {name!r} (known: {', '.join(self.names())})")
        return kind

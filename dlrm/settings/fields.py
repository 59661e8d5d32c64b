"""A setting is one dataclass field whose metadata says everything else about it: its flag (the
reference's name), help text, allowed values, a check, how its text is parsed, and whether
`--resume` may change it. The command line (dlrm/flags.py), the one-line validation errors, the
resume rules (dlrm/run_checks.py) and the flag tables in docs/ are all read from it, so a new
flag is one field.

No torch here: `python -m dlrm.train --help` builds its parser from these fields alone.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from dlrm.errors import ConfigError


@dataclass(frozen=True)
class Check:
    """A rule on one value; `expected` completes "--flag: {expected}, got {value}"."""

    ok: Callable[[Any], bool]
    expected: str


POSITIVE = Check(lambda v: v >= 1, "expected a positive integer")
AT_LEAST_0 = Check(lambda v: v >= 0, "expected an integer >= 0")
FINITE_AT_LEAST_0 = Check(lambda v: math.isfinite(v) and v >= 0, "expected a finite number >= 0")
POSITIVE_FINITE = Check(lambda v: math.isfinite(v) and v > 0, "expected a positive finite number")


def int_range(lo: int, hi: int) -> Check:
    return Check(lambda v: lo <= v <= hi, f"expected an integer from {lo} to {hi}")


@dataclass(frozen=True)
class ByteSize:
    """A size setting parsed once: `bytes` for every use, `text` as the user wrote it for
    config.json and messages (so `--hot-budget 2GB` is shown as 2GB, not 2147483648)."""

    bytes: int
    text: str
    number: bool = False  # given as a count of bytes: config.json keeps it a number

    def __str__(self) -> str:
        return self.text

    def to_json(self) -> str | int:
        """As it was given: config.json's value (a resumed run compares it with its own)."""
        return self.bytes if self.number else self.text


def byte_size(value: str | int | ByteSize, flag: str) -> ByteSize:
    """'256MB', '1.5GB', 1048576 -> a ByteSize; a mistake is found here, before any work."""
    if isinstance(value, ByteSize) or not isinstance(value, (str, int)) or isinstance(value, bool):
        return value  # parsed already, or the type check names the mistake
    from embeddings.hot_rows import parse_bytes  # imports torch: not while --help is parsed

    try:
        size = parse_bytes(value, flag)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    number = isinstance(value, int) and not isinstance(value, bool)
    return ByteSize(size, str(value), number)


def setting(
    default: Any,
    flag: str,
    help: str,
    *,
    choices: tuple | dict[Any, str] | Callable[[], tuple] | None = None,
    check: Check | None = None,
    parse: Callable[[Any, str], Any] | None = None,
    free: bool = False,
    name: str | None = None,
    aliases: tuple[str, ...] = (),
    const: Any = None,
    shown_default: str | None = None,
) -> Any:
    """One setting.

    flag: the command-line flag (the reference's name where it has one). name: the flat name
    (`TrainConfig(name=...)`, config.json's key); default the flag without dashes.
    choices: the allowed values, or {value: what it means} (listed in --help and the docs), or
    a function returning them where they live in a module --help must not import (the docs
    list them, --help does not).
    check: a rule on the value (None always passes). parse: `parse(value, flag)` turns what a
    user wrote ('13-512-256') into the field's type, raising ConfigError.
    free: `--resume` may change it without --allow-changed (it changes no computed number).
    aliases: other spellings of the flag. const: the value of the flag given without one.
    shown_default: the default as --help and the docs say it, where the value does not say it.
    """
    meta = dict(
        flag=flag, help=help, choices=choices, check=check, parse=parse, free=free,
        name=name or flag.lstrip("-").replace("-", "_"), aliases=aliases, const=const,
        shown_default=shown_default,
    )  # fmt: skip
    return dataclasses.field(default=default, metadata=meta)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _as(value: Any, hint: Any) -> Any:
    """`value` as the type `hint` (an int where a float is wanted, a list as a tuple); TypeError
    when it is not one (True is an int to Python, not to a setting)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        for arg in typing.get_args(hint):
            try:
                return _as(value, arg)
            except TypeError:
                pass
        raise TypeError
    if typing.get_origin(hint) is tuple:
        if not isinstance(value, (tuple, list)):
            raise TypeError
        return tuple(_as(x, typing.get_args(hint)[0]) for x in value)
    if hint is type(None):
        if value is not None:
            raise TypeError
        return None
    kind = {int: numbers.Integral, float: numbers.Real}.get(hint, hint)
    if not isinstance(value, kind) or (isinstance(value, bool) and hint is not bool):
        raise TypeError
    return hint(value) if hint in (int, float, str, bool) else value  # ByteSize: as parsed


_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
          ByteSize: "a string or an integer"}  # fmt: skip


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        # None is "not given" (filled from a default elsewhere), never what a user should write
        named = [a for a in typing.get_args(hint) if a is not type(None)]
        return " or ".join(_type_name(a) for a in named)
    if typing.get_origin(hint) is tuple:
        return f"a tuple of {typing.get_args(hint)[0].__name__}"
    return "None" if hint is type(None) else _NAMES.get(hint, hint.__name__)


class Section:
    """A group of settings for one capability. Its fields are parsed, typed and checked at
    construction (the one-line ConfigError names the flag); `check()` adds the rules between the
    section's own fields. A section is what its feature is handed."""

    title: ClassVar[str] = ""  # its heading in --help and the docs

    def __post_init__(self) -> None:
        hints = _hints(type(self))
        for f in dataclasses.fields(self):
            m, value = f.metadata, getattr(self, f.name)
            if m["parse"] is not None and value is not None:
                value = m["parse"](value, m["flag"])
            try:
                value = _as(value, hints[f.name])
            except TypeError:
                raise ConfigError(
                    f"{m['flag']}: expected {_type_name(hints[f.name])}, got {value!r}"
                ) from None
            object.__setattr__(self, f.name, value)
            if value is None:
                continue
            choices = allowed(f)
            if choices is not None and value not in choices:
                shown = ", ".join(str(c) for c in choices)
                raise ConfigError(f"{m['flag']}: expected one of {shown}, got {value!r}")
            if m["check"] is not None and not m["check"].ok(value):
                raise ConfigError(f"{m['flag']}: {m['check'].expected}, got {value}")
        self.check()

    def check(self) -> None:
        """Rules between this section's fields (one ConfigError naming the flag)."""


def allowed(f: dataclasses.Field):
    """A setting's allowed values (None: any of its type)."""
    choices = f.metadata["choices"]
    return choices() if callable(choices) else choices


def shown_default(f: dataclasses.Field) -> str:
    """The default as --help and the docs say it."""
    m = f.metadata
    if m["shown_default"] is not None:
        return m["shown_default"]
    value = f.default
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "-".join(map(str, value)) if value else "none"
    if value is None:
        return "none"
    if value == "":
        return "''"
    return str(value)

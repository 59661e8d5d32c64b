"""The command line and the docs' flag tables, both read from the settings' field metadata
(dlrm/settings/fields.py): a new flag is one field.

    python -m dlrm.flags --markdown training    # a docs table, as docs/training.md holds it
    python -m dlrm.flags --update-docs          # rewrite the tables between the docs' markers

No torch here: `python -m dlrm.train --help` must answer at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import re
import sys
import types
import typing
from pathlib import Path

from dlrm.settings.fields import _hints, allowed, shown_default
from hybrid_dlrm.common import ranks

EXIT_USAGE = 2
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def parse_bool_or_auto(text: str) -> bool | None:
    return None if text.strip().lower() == "auto" else parse_bool(text)


class OneLineParser(argparse.ArgumentParser):
    """argparse with a flag mistake as one line and exit code 2 (the dlrm CLIs' parser)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # a value that starts with a minus and a digit is a value (`--hot-budget -1GB`), which
        # its setting's check then refuses by name; argparse took it for an unknown flag and
        # said only "expected one argument" (no flag of ours starts with a digit)
        self._negative_number_matcher = re.compile(r"^-\d")

    def error(self, message: str) -> None:  # one line, not the usage block
        # under torchrun every rank parses the same flags: one line per machine, not per rank
        if ranks.first_to_fail():
            sys.stderr.write(f"{self.prog}: error: {message}{self._did_you_mean(message)}\n")
        sys.exit(EXIT_USAGE)

    def _did_you_mean(self, message: str) -> str:
        """For a mistyped flag (`--num-batchs`), the flags it is closest to."""
        if not message.startswith("unrecognized arguments: "):
            return ""
        flags = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
        guesses = []
        for word in message.removeprefix("unrecognized arguments: ").split():
            if word.startswith("--"):
                guesses += difflib.get_close_matches(word.split("=")[0], flags, n=2, cutoff=0.75)
        return f" (did you mean {' or '.join(dict.fromkeys(guesses))}?)" if guesses else ""


def _types(hint) -> set:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return set(typing.get_args(hint))
    return {hint}


def _argument(cls: type, f: dataclasses.Field) -> dict:
    """add_argument's keywords for one setting."""
    m, kinds = f.metadata, _types(_hints(cls)[f.name])
    kw = dict(dest=m["name"], default=argparse.SUPPRESS, help=help_text(f).replace("%", "%%"))
    if bool in kinds:  # --flag, --flag=false, --flag auto (where None means auto)
        kw.update(type=parse_bool_or_auto if type(None) in kinds else parse_bool, nargs="?",
                  const=True, metavar="BOOL")  # fmt: skip
    elif m["const"] is not None:  # --resume [FILE|DIR]
        kw.update(nargs="?", const=m["const"])
    elif int in kinds and str not in kinds:
        kw.update(type=int, metavar="N")
    elif float in kinds:
        kw.update(type=float, metavar="X")
    if m["choices"] is not None and not callable(m["choices"]):
        kw["metavar"] = "{" + ",".join(map(str, m["choices"])) + "}"
    return kw


def help_text(f: dataclasses.Field) -> str:
    m = f.metadata
    return f"{m['help']} (default: {shown_default(f)})"


def add_settings(parser: argparse.ArgumentParser, sections: dict[str, type]) -> None:
    """One argument per setting, grouped by section."""
    for cls in sections.values():
        group = parser.add_argument_group(_title(cls))
        for f in dataclasses.fields(cls):
            group.add_argument(f.metadata["flag"], *f.metadata["aliases"], **_argument(cls, f))


def _title(cls: type) -> str:
    return cls.title


# --- the docs' tables ------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table(classes: list[type]) -> str:
    rows = ["| flag | default | what |", "|---|---|---|"]
    for cls in classes:
        rows.append(f"| **{_cell(_title(cls))}** | | |")
        for f in dataclasses.fields(cls):
            m = f.metadata
            flags = ", ".join(f"`{x}`" for x in (m["flag"], *m["aliases"]))
            what, choices = m["help"], allowed(f) or ()
            if not all(str(c) in what for c in choices):
                what += ": " + ", ".join(f"`{c}`" for c in choices)
            literal = m["shown_default"] is None and f.default is not None
            default = f"`{shown_default(f)}`" if literal else shown_default(f)
            rows.append(f"| {flags} | {_cell(default)} | {_cell(what)} |")
    return "\n".join(rows)


def choices_table(cls: type, name: str) -> str:
    """The values of a setting whose choices say what each means."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    rows = [f"| `{f.metadata['flag']}` | what |", "|---|---|"]
    rows += [f"| `{value}` | {_cell(what)} |" for value, what in f.metadata["choices"].items()]
    return "\n".join(rows)


def tables() -> dict[str, str]:
    """The generated block of each docs marker: `<!-- flags:NAME -->` ... `<!-- /flags:NAME -->`."""
    from dlrm.config import SECTIONS

    placement = [SECTIONS[k] for k in ("placing", "fae", "hotline", "scm")]
    return {
        "training": markdown_table(list(SECTIONS.values())),
        "placement": choices_table(SECTIONS["placing"], "placement") + "\n\n"
        + markdown_table(placement),
    }  # fmt: skip


DOCS = {"training": "docs/training.md", "placement": "docs/placement.md"}


def _block(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- flags:{name} -->\n)(?:.*?\n)?(<!-- /flags:{name} -->)", re.S)


def docs_block(text: str, name: str) -> str | None:
    """The table between a page's markers (None: the page has no such markers)."""
    m = _block(name).search(text)
    return None if m is None else text[m.end(1) : m.start(2)].removesuffix("\n")


def update_docs(root: Path) -> list[str]:
    """Rewrites every docs table from the metadata; returns the pages that changed."""
    changed = []
    for name, table in tables().items():
        page = root / DOCS[name]
        text = page.read_text()
        new = _block(name).sub(lambda m, t=table: m.group(1) + t + "\n" + m.group(2), text)
        if new != text:
            page.write_text(new)
            changed.append(str(page))
    return changed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dlrm.flags", description=__doc__.splitlines()[0])
    p.add_argument("--markdown", choices=sorted(DOCS), help="print one docs table")
    p.add_argument("--update-docs", action="store_true", help="rewrite the docs' tables")
    args = p.parse_args(argv)
    if args.markdown:
        print(tables()[args.markdown])
    if args.update_docs:
        for page in update_docs(Path(__file__).resolve().parent.parent):
            print(f"updated {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Every relative link in README.md and docs/ points at a file that exists, and every `#anchor`
into a markdown file names one of its headings (GitHub's heading ids); every command the user
pages name (`python -m X`, `python scripts/X.py`, `scripts/X.sh`, torchrun's `-m X`) exists and
takes every flag the page gives it; every repository path and `-m` module a page names exists;
docs/architecture.md's counts are what their commands count."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def _prose_lines(path: Path) -> list[str]:
    """The page's lines outside fenced code blocks and HTML comments (a `# comment` in a shell
    block is no heading, and a `](` in code or in a comment is no link)."""
    lines, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(re.sub(r"<!--.*?-->", "", line))
    return lines


def _slug(heading: str) -> str:
    """GitHub's id for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _prose_lines(path):
        m = HEADING.match(line)
        if not m:
            continue
        slug = _slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(path: Path) -> list[str]:
    return [m.group(1) for line in _prose_lines(path) for m in LINK.finditer(line)]


def _is_external(target: str) -> bool:
    return re.match(r"^[a-z][a-z0-9+.-]*:", target) is not None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in links(page):
        if _is_external(target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_slug_follows_github() -> None:
    assert _slug("Denormal floats (`--flush-denormal`)") == "denormal-floats---flush-denormal"
    assert _slug("Taobao user behaviour (TBSM)") == "taobao-user-behaviour-tbsm"


# --- every command a page names exists and takes the flags the page gives it ------------------

USER_PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])  # not measurements/
COMMAND = re.compile(
    r"^(?:[A-Z_]+=\S+\s+)*"  # environment variables
    r"(?:(?:python\s+-m\s+dlrm\.torchrun\b.*?|python|torchrun\b.*?)\s+(-m\s+[\w.]+|scripts/\w+\.py)"
    r"|(scripts/\w+\.sh))(.*)$"
)
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def _commands(page: Path) -> list[tuple[int, str, str]]:
    """(line, module or script, the rest) of every command in a page: each line of a bash block
    (continuations joined, `&&` and `|` chains split) and each inline code span that starts
    with `python` or `torchrun` (an error message quoted in prose, `...: error:`, is none)."""
    out, fenced, lang, held = [], False, "", ""
    for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced, lang = not fenced, line.strip().strip("`~")
            continue
        if fenced and lang != "bash":
            continue
        if not fenced and line.count("`") % 2:  # a code span broken over two lines
            held, line = "", held + line
            if line.count("`") % 2:
                held = line + " "
                continue
        if fenced:
            code = held + line.split(" #")[0].strip()
            if code.endswith("\\"):
                held = code[:-1] + " "
                continue
            held, spans = "", re.split(r"\s(?:&&|\|)\s", code)
        else:
            spans = [s for s in re.findall(r"`([^`]+)`", line) if ": error:" not in s]
        for span in spans:
            m = COMMAND.match(span.strip())
            if m:
                target = (m.group(1) or m.group(2)).removeprefix("-m").strip()
                out.append((n, target, m.group(3)))
    return out


class _Parsed(Exception):
    pass


def _parser_of(target: str, monkeypatch) -> argparse.ArgumentParser:
    """The argparse parser a command builds: its main runs until it first parses, and stops
    there (nothing else of it runs)."""
    import runpy

    def capture(self, *args, **kwargs):
        raise _Parsed(self)

    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # dlrm.train would set it in os.environ
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", capture)
    monkeypatch.setattr(sys, "argv", [target, "--help"])
    try:
        if target.startswith("scripts/"):
            runpy.run_path(str(ROOT / target), run_name="__main__")
        else:
            runpy.run_module(target, run_name="__main__", alter_sys=False)
    except _Parsed as parsed:
        return parsed.args[0]
    finally:
        monkeypatch.undo()
    raise AssertionError(f"{target}: never parsed its command line")


def _flags(parser: argparse.ArgumentParser, words: list[str]) -> set[str]:
    """Every option string of the parser, of the subcommand named in `words` and of the
    parsers it hands arguments on to (perfmodel predict: dlrm.train's flags)."""
    flags = {s for a in parser._actions for s in a.option_strings}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            sub = next((w for w in words if w in action.choices), None)
            if sub is not None:
                flags |= _flags(action.choices[sub], words)
    return flags


@pytest.mark.filterwarnings(r"ignore:'[\w.]+' found in sys.modules:RuntimeWarning")
def test_every_command_in_the_docs_exists_with_its_flags(monkeypatch) -> None:
    import importlib.util

    from dlrm.train import build_parser

    train_flags = {s for a in build_parser()._actions for s in a.option_strings}
    parsers: dict[str, argparse.ArgumentParser] = {}
    wrong, seen = [], 0
    for page in USER_PAGES:
        for n, target, rest in _commands(page):
            where = f"{page.relative_to(ROOT)}:{n}: {target}"
            if target.startswith("scripts/"):
                if not (ROOT / target).is_file():
                    wrong.append(f"{where}: no such script")
                    continue
                if target.endswith(".sh"):  # run as written: it must be executable
                    if not os.access(ROOT / target, os.X_OK):
                        wrong.append(f"{where}: not executable")
                    continue
            elif importlib.util.find_spec(target) is None or (
                importlib.util.find_spec(target).submodule_search_locations
                and importlib.util.find_spec(f"{target}.__main__") is None
            ):
                wrong.append(f"{where}: no such module to run")
                continue
            if target not in parsers:
                parsers[target] = _parser_of(target, monkeypatch)
            words = re.sub(r"[\[\]|]", " ", rest).split()
            subs = [
                a for a in parsers[target]._actions if isinstance(a, argparse._SubParsersAction)
            ]
            if subs and not any(w in subs[0].choices for w in words):
                wrong.append(f"{where}: no subcommand of {sorted(subs[0].choices)}")
                continue
            known = _flags(parsers[target], words) | (
                train_flags if target == "perfmodel" else set()
            )
            given = {f.split("=")[0] for f in FLAG.findall(rest)}
            wrong += [f"{where}: no flag {f}" for f in sorted(given - known)]
            seen += 1
    assert seen > 100, seen  # the extraction found the pages' commands
    assert not wrong, "\n".join(wrong)


# --- every repository path and `-m` module a page names exists ------------------------------

# the pages that must name today's files (see test_every_path_and_module_a_page_names_exists)
NAMING_PAGES = [
    *USER_PAGES,
    ROOT / "data_pipeline" / "CRITEO.md",
    ROOT / "docs/measurements/README.md",
]
# the repository's top folders: a word that starts with one of them is a path
ROOTS = ("dlrm", "embeddings", "data_pipeline", "perfmodel", "hybrid_dlrm", "scripts", "tests",
         "docs")  # fmt: skip
REPO_PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(ROOTS) + r")/[\w./*-]*)")
RUN_MODULE = re.compile(r"(?:\bpython3?|\btorchrun\b[^`\n]*?)\s+-m\s+([A-Za-z_][\w.]*)")


def _module_runs(name: str) -> bool:
    """`python -m name` would run: a module, or a package with a `__main__`."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            spec = importlib.util.find_spec(f"{name}.__main__")
    except (ImportError, ValueError):  # a parent that is no package
        return False
    return spec is not None


def missing_names(text: str, root: Path = ROOT) -> list[str]:
    """`LINE: name` for every repository path (`dlrm/foo.py`, `embeddings/ssd/`, a glob such as
    `docs/measurements/scm/*.json`, `tests/x.py::test_y`) and every `python -m X` or torchrun
    `-m X` module in `text` that does not exist under `root`. A path is a word that starts with
    one of the repository's top folders; one inside a URL (`github.com/x/dlrm/...`) is none."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        line = re.sub(r"<!--.*?-->", "", line)  # a comment is no name a reader sees (walk: skip)
        for m in REPO_PATH.finditer(line):
            path = m.group(1).split("::")[0].split("#")[0].rstrip(".")
            found = any(root.glob(path)) if "*" in path else (root / path).exists()
            if not found:
                out.append(f"{n}: {path}")
        for m in RUN_MODULE.finditer(line):
            name = m.group(1).rstrip(".")
            if name != "X" and not _module_runs(name):  # `python -m X`: a placeholder
                out.append(f"{n}: python -m {name}")
    return out


def test_the_checker_finds_planted_names() -> None:
    page = "\n".join(
        [
            "Fine: `dlrm/compose.py`, [the tier](embeddings/ssd/tier.py), `dlrm/placement/`,",
            "`docs/measurements/scm/*.json`, `tests/test_layers.py::violations`, and",
            "`python -m dlrm.train --placement fae`, `torchrun --standalone -m dlrm.train`.",
            "Not ours: https://github.com/facebookresearch/dlrm/blob/main/dlrm/x.py, runs/dlrm/a.",
            "Gone: `dlrm/placement.py`, see [this](embeddings/scm_tier.py)",
            "`scripts/bench_nothing.py` and `docs/measurements/nothing/*.json`.",
            "`python -m hybrid_dlrm.serving.nothing --out x` and `python -m serving.quantize`,",
            "`torchrun --nproc_per_node 2 -m dlrm.nothing`, `python -m hybrid_dlrm` (no __main__).",
        ]
    )
    assert missing_names(page) == [
        "5: dlrm/placement.py",
        "5: embeddings/scm_tier.py",
        "6: scripts/bench_nothing.py",
        "6: docs/measurements/nothing/*.json",
        "7: python -m hybrid_dlrm.serving.nothing",
        "7: python -m serving.quantize",
        "8: python -m dlrm.nothing",
        "8: python -m hybrid_dlrm",
    ]


@pytest.mark.parametrize("page", NAMING_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_and_module_a_page_names_exists(page: Path) -> None:
    """The user pages (data_pipeline/CRITEO.md among them) and the index of measurements name only
    files and modules that exist. The measurement histories (docs/measurements/*.md but its
    README) are left out: each records a run as it was made, with the files and commands of its
    day; a file renamed since does not make that record wrong, and the user page beside it gives
    today's command."""
    missing = missing_names(page.read_text(encoding="utf-8"))
    assert not missing, f"{page.relative_to(ROOT)}: " + "; ".join(missing)


# --- the counts on the maintainer's page are what their commands count -----------------------

COUNT = re.compile(r"\*\*(\d+)\*\*\s*<!-- count: (.+?) -->")


def test_architecture_counts_are_what_their_commands_count() -> None:
    """docs/architecture.md's "what to edit" counts each name the command that counts it; when a
    mechanism changes (a placement becomes one registered object), the count must follow."""
    import subprocess

    page = ROOT / "docs" / "architecture.md"
    counts = COUNT.findall(page.read_text(encoding="utf-8"))
    assert len(counts) >= 4, counts
    wrong = []
    for shown, command in counts:
        out = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True)
        if out.stdout.strip() != shown:
            wrong.append(f"{shown} shown, {out.stdout.strip() or out.stderr.strip()!r}: {command}")
    assert not wrong, "docs/architecture.md: " + "; ".join(wrong)


def test_every_module_the_architecture_page_names_exists() -> None:
    """The map names most modules bare (`fused.py` in the row of `embeddings/`): each such name is
    a file's somewhere in the repository (the paths with folders are checked above)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    bare = set(re.findall(r"`(\w+\.(?:py|sh))`", text))
    assert len(bare) > 100, len(bare)  # the page's tables were read
    names = {p.name for top in ROOTS for p in (ROOT / top).rglob("*") if p.is_file()}
    assert not sorted(bare - names), sorted(bare - names)


# What a page's commands write: a flag's value, or a library call's out_dir / out / load path.
OUTPUT = re.compile(
    r"(?:--out-dir|--out|--save-model|--scm-dir|--placement-plan|--profile-file|--perf-log|--work)"
    r"[ =](\S+)|out_dir=\"([^\"]+)\"|\[\"[^\"]+\", \"--out\", \"([^\"]+)\""
)
USER_PAGES = [p for p in PAGES if "measurements" not in p.parts]


def outputs(text: str) -> set[str]:
    """The concrete output paths a page's code names (placeholders in capitals, `-` for stdout
    and `...` elisions are not paths)."""
    found = set()
    for line in text.splitlines():
        for m in OUTPUT.finditer(line):
            path = next(g for g in m.groups() if g).strip("`'\",)]")
            if path in ("-", "...") or path.isupper():
                continue
            found.add(path)
    return found


def test_every_output_of_the_pages_is_their_own_and_inside_the_working_directory():
    """Followed in order in one fresh directory, the pages never write over each other's outputs
    (a second run into `runs/a` is refused) nor outside the directory they run in."""
    owner: dict[str, str] = {}
    clashes, outside = [], []
    for page in USER_PAGES:
        name = str(page.relative_to(ROOT))
        for path in sorted(outputs(page.read_text(encoding="utf-8"))):
            if path.startswith("/") or path.startswith("~"):
                outside.append(f"{name}: {path}")
            if owner.setdefault(path, name) != name:
                clashes.append(f"{path}: {owner[path]} and {name}")
    assert not clashes, "outputs two pages write: " + "; ".join(clashes)
    assert not outside, "outputs outside the working directory: " + "; ".join(outside)


def test_the_output_scan_sees_flags_and_library_calls():
    text = ('python -m dlrm.train --out-dir runs/a --save-model M.pt\n'
            'quantize(["runs/x", "--out", "art/q"])  cfg = TrainConfig(out_dir="runs/lib")\n'
            "python -m perfmodel fit --out R --out-dir DIR --out -")  # fmt: skip
    assert outputs(text) == {"runs/a", "M.pt", "art/q", "runs/lib"}  # not R, DIR or stdout

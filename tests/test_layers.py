"""The packages depend one way: hybrid_dlrm.common <- data_pipeline <- embeddings <- dlrm <-
{hybrid_dlrm.serving, perfmodel} <- scripts. Every import of every module (at the top, inside functions, under
TYPE_CHECKING) is parsed with `ast` and checked against that order: a module may import its own
package and the packages below it, never one above it or beside it (hybrid_dlrm.serving and perfmodel are
both built on dlrm and on nothing of each other; scripts, the benchmarks and recipes, may use
everything). A violation fails with the file, the line and the import.

And no import cycle, even through function-level imports: the modules of hybrid_dlrm,
data_pipeline, embeddings, dlrm and perfmodel, each with an edge per module it imports anywhere
(`from a import b` is an edge to a.b when a.b is a module, to a otherwise), form no strongly
connected component. A package's `__init__` is its public face, which re-exports its own parts
(lazily: hybrid_dlrm/common/lazy.py), not a dependency of them: its edges to modules inside its
own package are not counted. In return no module imports the face of a package it is part of
(it imports the home module instead): with the face counted as what it re-exports, that import
would be a cycle. A cycle fails with its modules and, for each of its edges, the import line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# rank of each package: an import must go to the same rank (its own package) or a lower one
RANK = {"hybrid_dlrm.common": 0, "data_pipeline": 1, "embeddings": 2, "dlrm": 3,
        "hybrid_dlrm.serving": 4, "perfmodel": 4, "scripts": 5}  # fmt: skip

# Imports against the order that exist today, each with why. Empty is the goal; an entry that no
# longer matches fails too, so the list only shrinks.
KNOWN: dict[tuple[str, str], str] = {}


def _layer(module: str) -> str | None:
    """The layer of a dotted module name of this project (None: not ours)."""
    for package in RANK:
        if module == package or module.startswith(package + "."):
            return package
    return None


def _modules(root: Path = ROOT, packages: tuple[str, ...] = tuple(RANK)) -> list[tuple[str, Path]]:
    out = []
    for package in packages:
        base = root / package.replace(".", "/")
        for path in sorted(base.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out.append((".".join(parts), path))
    return out


def _from_base(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute dotted name that `node` imports from."""
    if not node.level:
        return node.module or ""
    # relative: from the module's package, one level up per extra dot
    here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    here = here[: len(here) - (node.level - 1)]
    return ".".join(here + ([node.module] if node.module else []))


def _imports(module: str, path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of everything `path` imports; `from a import b` yields a.b as well as
    a, so that importing a submodule through its package counts as importing the submodule."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(module, path, node)
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{a.name}") for a in node.names if a.name != "*"]
    return found


def _allowed(importer: str, imported: str) -> bool:
    a, b = _layer(importer), _layer(imported)
    if b is None or a == b:
        return True
    return RANK[b] < RANK[a]


def violations() -> list[tuple[str, str, str]]:
    """(importer, imported, where) of each import statement against the order (its first bad
    name). Names outside RANK are not ours: `import _shared` in a script is its own directory's."""
    out, seen = [], set()
    for module, path in _modules():
        for line, name in _imports(module, path):
            if (module, line) not in seen and not _allowed(module, name):
                seen.add((module, line))
                out.append((module, name, f"{path.relative_to(ROOT)}:{line}: imports {name}"))
    return out


def test_every_import_follows_the_layer_order():
    found = [v for v in violations() if (v[0], v[1]) not in KNOWN]
    assert not found, "imports against hybrid_dlrm.common <- data_pipeline <- embeddings <- " \
        "dlrm <- {hybrid_dlrm.serving, perfmodel} <- scripts:\n" + "\n".join(sorted({v[2] for v in found}))  # fmt: skip


def test_the_known_exceptions_still_exist():
    present = {(a, b) for a, b, _ in violations()}
    gone = [k for k in KNOWN if k not in present]
    assert not gone, f"no longer imported, remove from KNOWN: {gone}"


@pytest.mark.parametrize(
    "importer, imported, ok",
    [
        ("dlrm.trainer", "perfmodel.recorder", False),
        ("perfmodel.recorder", "dlrm.pipelines.base", True),
        ("embeddings.plan", "hybrid_dlrm.common.atomic", True),
        ("hybrid_dlrm.common.atomic", "data_pipeline.errors", False),
        ("data_pipeline.preprocess", "embeddings.profile", False),
        ("dlrm.trainer", "hybrid_dlrm.serving.quantize", False),
        ("hybrid_dlrm.serving.quantize", "dlrm.models.dlrm", True),
        ("hybrid_dlrm.serving.predictor", "perfmodel.model", False),
        ("scripts.bench_scm", "perfmodel.hardware", True),
        ("dlrm.train", "torch", True),
    ],
)
def test_the_rule(importer, imported, ok):
    assert _allowed(importer, imported) == ok


def test_relative_imports_are_resolved(tmp_path):
    pkg = tmp_path / "data_pipeline"
    pkg.mkdir()
    (pkg / "x.py").write_text("from .errors import DataError\nfrom . import y\n")
    assert [n for _, n in _imports("data_pipeline.x", pkg / "x.py")] == [
        "data_pipeline.errors", "data_pipeline.errors.DataError", "data_pipeline",
        "data_pipeline.y",
    ]  # fmt: skip


# --- flat setting names ---------------------------------------------------------------------------
# Flat names (`cfg.hot_budget`) are the command line's and config.json's; a feature reads its own
# section (`cfg.placing.hot_budget`). These layers are checked statically, so a flat read on a path
# no test runs is found too (dlrm/config.py's FlatNameRead finds the rest at run time).
FLAT_FREE = ("embeddings", "perfmodel", "hybrid_dlrm/serving")
CONFIG_NAMES = ("cfg", "config")


def _config_like(node: ast.expr) -> bool:
    """`cfg`, `config`, `base_cfg`, `self.cfg`, `trainer.config`: what holds a TrainConfig."""
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
    if name is None:
        return False
    return name in CONFIG_NAMES or name.endswith(tuple(f"_{n}" for n in CONFIG_NAMES))


def flat_reads(source: str, filename: str = "<source>") -> list[str]:
    """'file:line: cfg.NAME' for each attribute read by a flat setting name from a config."""
    from dlrm.config import FLAT

    return [
        f"{filename}:{node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(ast.parse(source, filename))
        if isinstance(node, ast.Attribute) and node.attr in FLAT and _config_like(node.value)
    ]


def test_no_flat_setting_is_read_outside_dlrm():
    found = []
    for package in FLAT_FREE:
        for path in sorted((ROOT / package).rglob("*.py")):
            found += flat_reads(path.read_text(), str(path.relative_to(ROOT)))
    assert not found, (
        "flat setting names read; read the section (cfg.training.seed):\n" + "\n".join(found)
    )


def test_a_planted_flat_read_is_found():
    planted = (
        "def step(cfg, trainer):\n"
        "    a = cfg.training.mini_batch_size\n"  # a section's field: fine
        "    b = cfg.mini_batch_size\n"
        "    c = trainer.cfg.hot_budget\n"
        "    d = base_cfg.slipstream\n"
        "    e = plan.seed, cfg.placing, config.run\n"  # not a config / sections: fine
    )
    assert flat_reads(planted, "x.py") == [
        "x.py:3: cfg.mini_batch_size",
        "x.py:4: trainer.cfg.hot_budget",
        "x.py:5: base_cfg.slipstream",
    ]


# --- no import cycle -----------------------------------------------------------------------------

CYCLE_PACKAGES = ("hybrid_dlrm", "data_pipeline", "embeddings", "dlrm", "perfmodel")

Edges = dict[str, dict[str, str]]  # importer -> {imported: "path:line: the import"}


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = CYCLE_PACKAGES) -> Edges:
    """Every module of `packages` with, per module it imports (anywhere in its file), where the
    first such import is. A face's imports of its own package's modules are left out (above)."""
    modules = dict(_modules(root, packages))
    faces = {m for m, path in modules.items() if path.name == "__init__.py"}
    graph: Edges = {m: {} for m in modules}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _from_base(module, path, node)
                names = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
                names = names or [base]
            else:
                continue
            where = f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}"
            for name in names:
                if name not in modules or name == module:
                    continue
                if module in faces and name.startswith(module + "."):
                    continue
                graph[module].setdefault(name, where)
    return graph


def cycles(graph: Edges) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return sorted(found)


def describe(cycle: list[str], graph: Edges) -> str:
    edges = [f"  {graph[a][b]}" for a in cycle for b in sorted(graph[a]) if b in cycle]
    return f"cycle of {', '.join(cycle)}:\n" + "\n".join(edges)


def own_face_imports(graph: Edges) -> list[str]:
    """Where a module imports the face of a package it is part of."""
    return [
        where
        for module, imported in graph.items()
        for name, where in imported.items()
        if module.startswith(name + ".")
    ]


def test_no_import_cycle():
    graph = import_graph()
    found = cycles(graph)
    assert not found, "\n".join(describe(c, graph) for c in found)


def test_no_module_imports_its_own_packages_face():
    found = own_face_imports(import_graph())
    assert not found, "import the home module, not the package's face:\n" + "\n".join(found)


def _plant(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_a_planted_cycle_is_found_with_its_import_lines(tmp_path):
    _plant(tmp_path, {
        "pkg/__init__.py": "from pkg.a import A\n\ndef __getattr__(name):\n    from pkg import b\n",
        "pkg/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\nA = 1\n",
        "pkg/b.py": "def f():\n    from pkg import a\n\nB = 2\n",
        "pkg/c.py": "import pkg.a\nfrom pkg import b\n",
        "low/__init__.py": "",
        "low/x.py": "import os\nfrom pkg.c import nothing\n",
    })  # fmt: skip
    graph = import_graph(tmp_path, ("pkg", "low"))
    assert graph["pkg"] == {}  # the face's own parts are not its dependencies
    assert graph["pkg.c"] == {
        "pkg.a": "pkg/c.py:1: import pkg.a",
        "pkg.b": "pkg/c.py:2: from pkg import b",
    }
    assert cycles(graph) == [["pkg.a", "pkg.b"]]
    assert describe(["pkg.a", "pkg.b"], graph) == (
        "cycle of pkg.a, pkg.b:\n  pkg/a.py:3: from .b import B\n  pkg/b.py:2: from pkg import a"
    )
    assert own_face_imports(graph) == []


def test_a_module_importing_its_own_face_is_found(tmp_path):
    _plant(tmp_path, {
        "pkg/__init__.py": "def __getattr__(name):\n    from pkg.sub.deep import thing\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/deep.py": "from pkg import thing\nfrom pkg.sub import other\nthing = 1\n",
    })  # fmt: skip
    graph = import_graph(tmp_path, ("pkg",))
    assert cycles(graph) == []
    assert own_face_imports(graph) == [
        "pkg/sub/deep.py:1: from pkg import thing", "pkg/sub/deep.py:2: from pkg.sub import other",
    ]  # fmt: skip

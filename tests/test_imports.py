"""Every module of every package imports: the floor under `make test-fast`, which leaves some of
a module's tests to the slow tier but never a module unimported. The packages are the ones
pyproject.toml ships, so a new one is covered without touching this file. `__main__` modules
are imported too: each keeps its command behind `if __name__ == "__main__"`.
"""

import importlib
import pkgutil
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _packages() -> list[str]:
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return [pattern.rstrip("*") for pattern in setup["packages"]["find"]["include"]]


def test_the_packages_are_read_from_pyproject():
    assert {"hybrid_dlrm", "data_pipeline", "embeddings", "dlrm", "perfmodel"} <= set(_packages())


@pytest.mark.parametrize("package", _packages())
def test_every_module_of_the_package_imports(package):
    failed: dict[str, str] = {}

    def note(name: str) -> None:  # a subpackage walk_packages could not import to look inside
        failed[name] = "cannot import it to list its modules"

    root = importlib.import_module(package)
    names = [m.name for m in pkgutil.walk_packages(root.__path__, f"{package}.", onerror=note)]
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:
            failed[name] = f"{type(e).__name__}: {e}"
    assert len(names) > 1
    assert not failed, failed

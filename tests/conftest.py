"""Fixtures for the whole suite, and the rule that splits it into two tiers.

`make test` runs every test (CI), the walk of the pages included (marked `walk` and slow: about
80 processes, two pages at a time; `make test-docs` runs it alone); `make test-fast` runs
`pytest -m "not slow"`, which still
imports every module (tests/test_imports.py) and trains every placement a few steps
(tests/dlrm/test_every_placement_trains.py).

The rule: a test is `slow` when it starts a process or trains more than MAX_FAST_STEPS steps.
It lives here and nowhere else; no test is marked slow by hand.
- At collection (`pytest_collection_modifyitems`), a test is marked slow when its function, a
  fixture it requests, or a helper of tests/ or scripts/ that these name, refers to a process
  launcher (`subprocess`, `multiprocessing`, `torch.multiprocessing`, `os.fork`...), or when it
  requests `long_training` or `starts_processes`: how a test that trains longer, or whose
  process starts inside product code (out of this scan's sight), declares it.
- At run time, a test not marked slow fails, naming the cause, when the repository's code starts
  a process (Popen, a multiprocessing start, `mp.spawn`, os.fork) or when `dlrm.trainer.Trainer`
  steps more than MAX_FAST_STEPS times during it. A process a library starts for itself
  (TorchInductor's compiler, ctypes looking up a library) is not the test's and does not count.
  So a mark cannot drift from what its test does, including in tests written after the rule.
"""

import functools
import inspect
import multiprocessing.process
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

# The checkout under test need not be the installed distribution whose entry points name the
# plugins `python -m dlrm.train` loads (dlrm/pipelines/step_hooks.py); tests/perfmodel/test_plugin.py checks
# that pyproject.toml declares the same one.
os.environ.setdefault("HYBRID_DLRM_PLUGINS", "perfmodel.recorder")
# The performance model's per-machine figures (hardware, disk, staging; perfmodel/hardware.py)
# that --placement auto's predictions measure: into a directory of this session, never the
# user's ~/.cache (a test must not leave files behind, nor read a model fitted elsewhere).
_CACHE = tempfile.mkdtemp(prefix="hybrid-dlrm-test-cache-")
os.environ.setdefault("HYBRID_DLRM_CACHE", _CACHE)
# Without a fitted model a plan or a prediction calibrates one at its run's shapes (about 25 s,
# perfmodel/calibration.py): off for the suite, whose planning tests then predict from the
# roofline; tests/perfmodel/test_calibration.py turns it on where it is the subject.
os.environ.setdefault("HYBRID_DLRM_CALIBRATE", "off")


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_CACHE, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _slow_because(item) is not None:
            item.add_marker(pytest.mark.slow)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# --- the tier rule (see the top of this file) -------------------------------------------------

# The tiny config (tests/dlrm/conftest.py `tiny`) trains 30 steps an epoch. 20 lets a fast test
# train a short run: a few steps, a checkpoint or two, a resume of them. A full epoch, two runs
# compared bit for bit, a learning curve are the slow tier's: measured under load, the tests
# training 21 to 40 steps held half the fast tier's CPU time, and it must fit in a minute on two
# cores (60, then 40, did not).
MAX_FAST_STEPS = 20
ROOT = Path(__file__).resolve().parent.parent
# Whose code the scan follows from a test: the tests' helpers and the scripts they drive. Product
# code is left to the run-time guard: followed, it reaches nearly everything from any test.
_FOLLOWED = (ROOT / "tests", ROOT / "scripts")
_LAUNCHER_MODULES = ("subprocess", "multiprocessing", "torch.multiprocessing", "pty",
                     "concurrent.futures.process")  # fmt: skip
# (os.system and os.popen left out: `platform.system()` next to `os.environ` would read as one)
_OS_LAUNCHERS = {"fork", "forkpty", "posix_spawn", "posix_spawnp", "spawnv", "spawnve", "spawnl",
                 "spawnle", "execv", "execve"}  # fmt: skip
# Fixtures that do nothing but declare a test slow; session-scoped so that a fixture of any
# scope may request them.
_DECLARATIONS = ("long_training", "starts_processes")


@pytest.fixture(scope="session")
def long_training() -> None:
    """Requested by a test (or a fixture) that trains more than MAX_FAST_STEPS steps: slow."""


@pytest.fixture(scope="session")
def starts_processes() -> None:
    """Requested by a test (or a fixture) whose process starts inside product code, where the
    collection-time scan does not look: slow."""


def _slow_because(item: pytest.Item) -> str | None:
    """Why the rule marks `item` slow, or None: a declaration it requests, or the launcher its
    function, a fixture of the tests it uses, a helper or a parameter reaches."""
    names = getattr(item, "fixturenames", ())
    declared = [name for name in _DECLARATIONS if name in names]
    if declared:
        return f"requests {declared[0]}"
    roots = [getattr(item, "obj", None)]
    info = getattr(item, "_fixtureinfo", None)
    for defs in info.name2fixturedefs.values() if info else ():
        roots.extend(d.func for d in defs)
    callspec = getattr(item, "callspec", None)
    roots.extend(callspec.params.values() if callspec else ())
    for root in roots:
        hashable = inspect.isfunction(root) or inspect.isclass(root) or inspect.ismethod(root)
        if hashable and (found := _launcher(root)) is not None:
            return found
    return None


@functools.cache
def _launcher(root: Callable) -> str | None:
    """`where uses what` for the first process launcher `root` names, directly or through the
    functions and classes of tests/ and scripts/ it names; None when it names none."""
    todo, seen = [root], set()
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if inspect.isclass(obj):
            todo.extend(v.__func__ if isinstance(v, staticmethod | classmethod) else v
                        for v in vars(obj).values())  # fmt: skip
            continue
        inner = getattr(getattr(obj, "hypothesis", None), "inner_test", None)  # under @given
        obj = inspect.unwrap(inner or obj)
        code = getattr(obj, "__code__", None)
        if code is None or not _ours(code.co_filename, _FOLLOWED):
            continue
        for c in _codes(code):
            names = set(c.co_names)
            for name in names:
                # a module imported inside the function is named in co_names too
                value = obj.__globals__.get(name)
                launches = _within(name, _LAUNCHER_MODULES) or _from_launcher(value)
                if launches or (name == "os" and names & _OS_LAUNCHERS):
                    return f"{obj.__qualname__} ({code.co_filename}) uses {name}"
                if inspect.isfunction(value) or inspect.isclass(value):
                    todo.append(value)
    return None


def _codes(code) -> Iterator:
    """`code` and the code of the functions, lambdas and comprehensions inside it."""
    yield code
    for const in code.co_consts:
        if inspect.iscode(const):
            yield from _codes(const)


def _from_launcher(value) -> bool:
    if value is None:
        return False
    module = value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", None)
    return isinstance(module, str) and _within(module, _LAUNCHER_MODULES)


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _ours(filename: str, under: tuple[Path, ...] = (ROOT,)) -> bool:
    path = Path(filename)
    return "site-packages" not in path.parts and any(path.is_relative_to(d) for d in under)


class _Guard:
    """What the running test phase may do. `test` is the id of a test not marked slow, None
    while nothing is guarded (collection, a slow test, pytest's own work); `broken` is the
    refusal a test met, kept for the end of its phase in case the test swallowed it."""

    test: str | None = None
    steps = 0
    broken: str | None = None


_guard = _Guard()
# Machinery between the code that asks for a process and the process: skipped when looking for
# who asked.
_MACHINERY = (*_LAUNCHER_MODULES, "os", "concurrent.futures", "torch.distributed.elastic",
              "torch.distributed.run")  # fmt: skip


def _refuse(why: str) -> None:
    _guard.broken = f"{_guard.test} is not marked slow, yet it (or a fixture it set up) {why}"
    # a worker thread refused gets to die quietly: the test fails at the end of its phase
    if threading.current_thread() is threading.main_thread():
        pytest.fail(_guard.broken, pytrace=False)


def _check_process(what: str) -> None:
    if _guard.test is None:
        return
    frame = sys._getframe(2)
    while frame is not None and _within(frame.f_globals.get("__name__", ""), _MACHINERY):
        frame = frame.f_back
    if frame is None or not _ours(frame.f_code.co_filename):
        return  # a library's own process
    _refuse(
        f"started a process ({what[:120]}) at {frame.f_code.co_filename}:{frame.f_lineno}. "
        "tests/conftest.py marks a test slow when its function, its fixtures or the tests' "
        "helpers use subprocess or multiprocessing; where the process starts inside product "
        "code, request the `starts_processes` fixture"
    )


def _count_step() -> None:
    if _guard.test is None:
        return
    _guard.steps += 1
    if _guard.steps > MAX_FAST_STEPS:
        _refuse(
            f"trained more than {MAX_FAST_STEPS} steps (MAX_FAST_STEPS, tests/conftest.py): "
            "train fewer (tests/dlrm/conftest.py `tiny` trains 30 an epoch) or request the "
            "`long_training` fixture (from the fixture that trains, if one does), which marks "
            "the test slow"
        )


_originals: dict[str, Callable] = {}


def pytest_configure(config):
    popen_start = _originals["popen"] = subprocess.Popen._execute_child
    process_start = _originals["process"] = multiprocessing.process.BaseProcess.start
    fork = _originals["fork"] = os.fork

    def guarded_popen(self, args, *rest, **kw):
        _check_process(f"{args!r}")
        return popen_start(self, args, *rest, **kw)

    def guarded_start(self):
        _check_process(f"multiprocessing {self.name}")
        return process_start(self)

    def guarded_fork():
        _check_process("os.fork")
        return fork()

    subprocess.Popen._execute_child = guarded_popen
    multiprocessing.process.BaseProcess.start = guarded_start
    os.fork = guarded_fork


def pytest_unconfigure(config):
    if _originals:
        subprocess.Popen._execute_child = _originals["popen"]
        multiprocessing.process.BaseProcess.start = _originals["process"]
        os.fork = _originals["fork"]
    trainer = sys.modules.get("dlrm.trainer")
    if trainer is not None and "step" in _originals:
        trainer.Trainer._step = _originals["step"]


def _count_trainer_steps() -> None:
    """Wraps `Trainer._step` once dlrm.trainer is imported (by the test modules, at collection):
    importing it here would cost every session, dlrm's or not, torchrec's import."""
    trainer = sys.modules.get("dlrm.trainer")
    if trainer is None or "step" in _originals:
        return
    step = _originals["step"] = trainer.Trainer._step

    @functools.wraps(step)
    def counted(self, batches):
        out = step(self, batches)
        if out is not None:  # None: the epoch had nothing left, no step was taken
            _count_step()
        return out

    trainer.Trainer._step = counted


def _guarded(item: pytest.Item):
    """One phase of a test (setup, call, teardown) under the guard, unless the test is slow."""
    _count_trainer_steps()
    _guard.test = None if item.get_closest_marker("slow") else item.nodeid
    try:
        result = yield
    finally:
        _guard.test = None
        broken, _guard.broken = _guard.broken, None
    if broken is not None:
        pytest.fail(broken, pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    _guard.steps = 0
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    try:
        return (yield from _guarded(item))
    finally:
        # a Trainer flushes denormals to zero for the process (dlrm.trainer.set_flush_denormal):
        # a later test that draws subnormal floats (hypothesis) must not depend on the order
        torch.set_flush_denormal(False)


@pytest.fixture
def one_thread():
    """One intra-op thread for the test (`pytestmark = pytest.mark.usefixtures("one_thread")`):
    tiny batches, where on a shared 2-core machine a thread waiting for a busy core at every op
    costs far more than it saves."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tmpfs(tmp_path):
    """`tmpfs("size=256k")` -> a directory on a fresh tmpfs mounted with those options, unmounted
    after the test (a real full or read-only file system needs root: skipped elsewhere)."""
    mounted: list[Path] = []

    def mount(options: str) -> Path:
        where = tmp_path / f"tmpfs{len(mounted)}"
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                              capture_output=True)  # fmt: skip
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs ({options}) here: needs root")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)

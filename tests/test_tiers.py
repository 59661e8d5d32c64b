"""The tier rule of tests/conftest.py: what its scan marks slow, and that its run-time guard fails
a fast test that starts a process or trains past MAX_FAST_STEPS, which the scan may not see."""

import importlib
import sys

import pytest

from dlrm import Trainer

from .dlrm.conftest import tiny

rule = sys.modules["tests.conftest"]  # the conftest pytest loaded, not a second copy


def _runs_a_command():
    subprocess.run(["true"])  # noqa: F821  (named, never run: the scan reads names)


def _through_a_helper():
    return _runs_a_command()


def _imports_inside():
    import torch.multiprocessing as mp

    mp.spawn(print)


def _forks():
    import os

    os.fork()


def _pure(x):
    return [y for y in range(x) if y % 2]


# in a dict, which the scan does not follow: named directly, they would make the test below slow
EXAMPLES = {
    f.__name__: f for f in (_through_a_helper, _runs_a_command, _imports_inside, _forks, _pure)
}


def test_the_scan_finds_a_launcher_in_a_helper_an_inner_import_or_os_fork(request):
    assert "_runs_a_command" in rule._launcher(EXAMPLES["_through_a_helper"])
    assert "uses subprocess" in rule._launcher(EXAMPLES["_runs_a_command"])
    assert "multiprocessing" in rule._launcher(EXAMPLES["_imports_inside"])
    assert "uses os" in rule._launcher(EXAMPLES["_forks"])
    assert rule._launcher(EXAMPLES["_pure"]) is None
    assert request.node.get_closest_marker("slow") is None


def test_a_process_the_scan_cannot_see_fails_a_fast_test():
    hidden = importlib.import_module("sub" + "process")  # out of the scan's sight
    try:
        with pytest.raises(pytest.fail.Exception) as e:
            hidden.run(["true"])
    finally:
        rule._guard.broken = None  # refused as expected: the test does not fail for it
    assert "test_a_process_the_scan_cannot_see_fails_a_fast_test is not marked slow" in str(e.value)
    assert "started a process (['true'])" in str(e.value)
    assert "request the `starts_processes` fixture" in str(e.value)


def test_a_step_past_the_limit_fails_a_fast_test(tmp_path):
    trainer = Trainer(tiny(tmp_path, num_batches=1, test_data_size=64))
    rule._guard.steps = rule.MAX_FAST_STEPS  # as if the test had trained that much already
    try:
        with pytest.raises(pytest.fail.Exception) as e:
            trainer.fit()
    finally:
        rule._guard.broken = None
    assert f"trained more than {rule.MAX_FAST_STEPS} steps" in str(e.value)
    assert "request the `long_training` fixture" in str(e.value)


@pytest.mark.usefixtures("long_training")
def test_a_declaration_marks_its_test_slow(request):
    assert request.node.get_closest_marker("slow") is not None
    assert rule._slow_because(request.node) == "requests long_training"


def test_a_test_that_starts_nothing_stays_fast(request):
    assert request.node.get_closest_marker("slow") is None

import os
import shutil
import subprocess
import tempfile
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


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_CACHE, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


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

import importlib.util
from pathlib import Path

import torch

from dlrm.checkpoints import format as ckpt
from hybrid_dlrm.common import crc as checksum

_SPEC = importlib.util.spec_from_file_location(
    "bench_checkpoint", Path(__file__).parents[2] / "scripts" / "bench_checkpoint.py"
)
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)


def test_in_process_times_a_verified_checkpoint(tmp_path):
    path = tmp_path / "c.pt"
    ckpt.save({"format": ckpt.FORMAT, "version": ckpt.VERSION, "model": {"w": torch.ones(3)}}, path)
    report = bench.in_process(path, repeats=1)
    assert report["file_bytes"] == path.stat().st_size
    assert set(report) == {
        "file_bytes",
        "threads",
        "crc32",
        "load_avg",
        "torch_load_s",
        "verify_s",
        "verify_zlib_s",
        "checksums_on_save_s",
        "checksums_on_save_zlib_s",
    }
    assert ckpt.crc32 is checksum.crc32  # the zlib comparison put the fast one back

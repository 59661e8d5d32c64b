"""The performance model's CUDA path: run on a machine with a CUDA device (skipped elsewhere)."""

import random

import pytest
import torch

from perfmodel import hardware, sweeps
from perfmodel import trace as tr

pytestmark = pytest.mark.gpu


def test_cuda_hardware_description_is_measured():
    desc = hardware.measure(quick=True)
    assert desc["cuda_sm_count"] > 0 and desc["cuda_memory_bytes"] > 0
    assert all(desc["cuda_matmul_tflops"][d] > 0.1 for d in ("fp32", "bf16", "fp16"))
    assert desc["cuda_mem_bw_gbs"] > 10 and desc["h2d_gbs"] > 0.1


def test_cuda_trace_attributes_device_time_to_the_compute_ops():
    lin = torch.nn.Linear(64, 32, device="cuda")
    x = torch.randn(256, 64, device="cuda")
    from torch.profiler import ProfilerActivity, profile

    lin(x).sum().backward()
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True
    ) as prof:
        with torch.autograd.profiler.record_function(tr.STEP_LABEL):
            lin(x).sum().backward()
            torch.cuda.synchronize()
    [graph] = tr.graph_from_events(prof.events(), uses_cuda=True)
    kernels = [k for op in graph["ops"] for k in op["kernels"]]
    addmm = [k for k in kernels if k["name"] == "aten::addmm"]
    assert addmm and addmm[0]["stream"].startswith("cuda") and addmm[0]["dur_us"] > 0
    assert addmm[0]["shapes"][:3] == [[32], [256, 64], [64, 32]] and addmm[0]["device_kernels"]
    assert any(k["name"] == "aten::mm" and k["stream"].startswith("cuda") for k in kernels)


@pytest.mark.parametrize("sweep", ["gemm", "mlp", "elementwise", "copy"])
def test_sweeps_run_on_the_cuda_device(sweep, monkeypatch):
    monkeypatch.setattr(sweeps, "DEVICE", torch.device("cuda"))
    recs = sweeps.SWEEPS[sweep](random.Random(0), 2, 3)
    assert recs and any(str(r["stream"]).startswith("cuda") for r in recs)
    assert all(r["dur_us"] > 0 for r in recs if str(r["stream"]).startswith("cuda"))

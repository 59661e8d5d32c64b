"""The GEMM sweep measures the cross layers' GEMMs as the DCN step runs them: the layouts and
(M, N, K) of `sweeps.cross_layer_gemms` are those of the captured graph's cross-layer GEMMs, the
sweep draws every such layout, and the widths and ranks of the report's DCN configurations (and
of MLPerf's DLRM-DCNv2) lie inside the swept range. No timing: the draws' GEMMs are not run."""

from __future__ import annotations

import collections
import random

import pytest
import torch

from dlrm.config import TrainConfig
from perfmodel import sweeps
from perfmodel.features import gemm_dims
from perfmodel.graph import graph_for, kernel_contexts
from perfmodel.interactions import is_cross_gemm
from perfmodel.report import dcn_configs

BASE = dict(
    arch_embedding_size=(60, 40, 500, 7), arch_sparse_feature_size=4, arch_mlp_bot=(13, 16, 4),
    arch_mlp_top=(16, 1), data_size=64 * 4, test_data_size=64, progress=False,
)  # fmt: skip
LAYERS, RANK, BATCH = 2, 3, 256
WIDTH = (4 + 1) * 4


def _layout(rec: dict) -> tuple:
    d = gemm_dims(rec)
    return rec["name"], d["M"], d["N"], d["K"], d["bf16"], d["ta"], d["tb"], d["bias"]


def _cross_gemms(precision: str) -> list[dict]:
    cfg = TrainConfig(**BASE, arch_interaction_op="dcn", dcn_num_layers=LAYERS,
                      dcn_low_rank_dim=RANK, precision=precision)  # fmt: skip
    graphs, _ = graph_for(cfg, BATCH)
    out = []
    for op in graphs["step"][1]:
        for k, where in zip(op["kernels"], kernel_contexts(op)):
            if is_cross_gemm(dict(k, op=where)):
                out.append(k)
    return out


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_sweep_runs_the_cross_layers_gemms_in_the_steps_layouts(
    tmp_path, monkeypatch, precision
):
    monkeypatch.setenv("HYBRID_DLRM_CACHE", str(tmp_path))
    step = collections.Counter(_layout(k) for k in _cross_gemms(precision))
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    swept = collections.Counter(
        _layout(sweeps._gemm_record(name, args, 0.0, {}))
        for name, args, _ in sweeps.cross_layer_gemms(BATCH, WIDTH, RANK, dtype)
    )
    # six GEMMs per layer, each layer the same
    assert sum(step.values()) == 6 * LAYERS
    assert step == collections.Counter({k: LAYERS * n for k, n in swept.items()})


def test_the_gemm_sweep_draws_every_cross_layer_layout_across_the_configured_range(monkeypatch):
    drawn = []

    def record(name, tensors, fn, reps, ctx):  # the draw's GEMM, not run
        rec = sweeps._gemm_record(name, tensors, 0.0, ctx)
        drawn.append(rec)
        return rec

    monkeypatch.setattr(sweeps, "_timed_gemm", record)
    sweeps.bench_gemm(random.Random(0), 60, reps=1)
    layouts = {(r["name"], *(gemm_dims(r)[k] for k in ("bf16", "ta", "tb", "bias"))) for r in drawn}
    cross = {
        ("aten::mm", bf16, ta, tb, 0) for bf16 in (0, 1) for ta, tb in ((0, 1), (0, 0), (1, 0))
    }
    assert cross <= layouts, cross - layouts
    # the forward mm(x, W.t()) of a cross layer: drawn over rank and width, both dtypes
    forward = [gemm_dims(r) for r in drawn if r["name"] == "aten::mm" and gemm_dims(r)["tb"]]
    assert len({(d["K"], d["N"]) for d in forward}) >= 5

    lo_w, hi_w = sweeps.CROSS_WIDTH
    lo_r, hi_r = sweeps.CROSS_RANK
    for name, c in dcn_configs():
        if c.get("arch_interaction_op") == "dcn":
            width = (26 + 1) * c.get("arch_sparse_feature_size", 16)  # the synthetic data's tables
            assert lo_w <= width <= hi_w and lo_r <= c["dcn_low_rank_dim"] <= hi_r, name
    assert lo_w <= 27 * 128 <= hi_w and lo_r <= 512 <= hi_r  # MLPerf's DLRM-DCNv2

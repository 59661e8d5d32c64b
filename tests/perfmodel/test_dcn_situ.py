"""DCN's cross-layer GEMMs are an in-situ family of their own: they never take the MLP GEMMs'
type-wide factor (or an MLP layer's with the same strides), and the captured graph's kernels
carry the op context those keys need."""

from __future__ import annotations

import pytest

from perfmodel.kernel_models import GemmRoofline
from perfmodel.kernels import KernelModels


def _mm(op: str, shapes=((256, 20), (20, 3)), strides=((20, 1), (1, 20))) -> dict:
    return {"name": "aten::mm", "op": op, "shapes": [list(s) for s in shapes],
            "strides": [list(s) for s in strides], "dtypes": ["float", "float"]}  # fmt: skip


def test_cross_layer_gemms_keep_their_own_in_situ_factor():
    models = KernelModels({"gemm": GemmRoofline()})
    forward = _mm("aten::linear#0")
    backward = _mm("autograd::engine::evaluate_function: MmBackward0#0",
                   ((256, 3), (3, 20)), ((3, 1), (20, 1)))  # fmt: skip
    # an MLP layer's input gradient with the very same strides (a top layer as wide as the rank)
    mlp = dict(backward, op="autograd::engine::evaluate_function: AddmmBackward0#0")
    strides_key = "aten::mm|fp32|[[3, 1], [20, 1]]"
    models.in_situ = {"gemm|fp32": 1.4, strides_key: 1.2}
    assert models.situ_factor(mlp, 10.0) == pytest.approx(1.2)
    assert models.situ_factor(forward, 10.0) == 1.0  # no DCN fit trace: isolated speed
    assert models.situ_factor(backward, 10.0) == 1.0
    models.in_situ["gemm|fp32|crossnet"] = 1.1  # a DCN fit trace gives the family its factor
    assert models.situ_factor(forward, 10.0) == pytest.approx(1.1)
    models.in_situ[f"{strides_key}|crossnet"] = 0.9
    assert models.situ_factor(backward, 10.0) == pytest.approx(0.9)
    assert models.situ_factor(mlp, 10.0) == pytest.approx(1.2)


def test_the_captured_graphs_kernels_carry_their_op_context(tmp_path, monkeypatch):
    from dlrm.config import TrainConfig
    from perfmodel.graph import graph_for, kernel_contexts

    monkeypatch.setenv("HYBRID_DLRM_CACHE", str(tmp_path))
    cfg = TrainConfig(arch_embedding_size=(60, 40), arch_sparse_feature_size=4,
                      arch_mlp_bot=(13, 4), arch_mlp_top=(8, 1), data_size=256,
                      test_data_size=64, progress=False, arch_interaction_op="dcn",
                      dcn_num_layers=1, dcn_low_rank_dim=2)  # fmt: skip
    graphs, _ = graph_for(cfg, 64)
    ops = graphs["step"][1]
    assert all(k["op"] == c for op in ops for k, c in zip(op["kernels"], kernel_contexts(op)))
    assert any(KernelModels.situ_keys(k)[-1] == "gemm|fp32|crossnet"
               for op in ops for k in op["kernels"])  # fmt: skip

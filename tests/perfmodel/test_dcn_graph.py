"""The performance model covers DCN: the captured graph of a dcn model holds its cross layers'
GEMMs (forward and backward, as aten::mm the GEMM model predicts) and element-wise ops, and the
model predicts its step."""

from __future__ import annotations

import collections

from dlrm.config import TrainConfig
from perfmodel.features import gemm_dims, op_type
from perfmodel.graph import graph_for
from perfmodel.kernel_models import GemmRoofline, RooflineTable
from perfmodel.kernels import KernelModels
from perfmodel.model import PerfModel
from perfmodel.overheads import Overheads
from perfmodel.report import heldout_configs

BASE = dict(
    arch_embedding_size=(60, 40, 500, 7), arch_sparse_feature_size=4, arch_mlp_bot=(13, 16, 4),
    arch_mlp_top=(16, 1), data_size=64 * 4, test_data_size=64, progress=False,
)  # fmt: skip
LAYERS, RANK, BATCH = 2, 3, 256
N = (4 + 1) * 4  # the cross layers' width: (tables + 1) * dim


def _graph(interaction: str):
    cfg = TrainConfig(**BASE, arch_interaction_op=interaction, dcn_num_layers=LAYERS,
                      dcn_low_rank_dim=RANK)  # fmt: skip
    graphs, _ = graph_for(cfg, BATCH)
    return graphs["step"][1]


def test_dcn_graph_has_the_cross_layers_and_a_predicted_time(tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRID_DLRM_CACHE", str(tmp_path))
    dcn, dot = _graph("dcn"), _graph("dot")
    # every GEMM of the cross layers, by its (M, N, K): forward x V^T and (xV^T) W^T; backward
    # the input and weight gradients of each, once per layer
    dims = collections.Counter()
    for op in dcn:
        for k in op["kernels"]:
            if op_type(k["name"]) == "gemm":
                d = gemm_dims(k)
                dims[(d["M"], d["N"], d["K"])] += 1
    forward = {(BATCH, RANK, N), (BATCH, N, RANK)}
    backward = {(RANK, N, BATCH), (N, RANK, BATCH)}  # the kernels' weight gradients
    for mnk in forward | backward:
        assert dims[mnk] >= LAYERS, (mnk, dims)
    names = collections.Counter(k["name"] for op in dcn for k in op["kernels"])
    assert names["aten::mul"] >= 2 * LAYERS  # x0 * (...), forward and backward

    models = KernelModels(
        {"gemm": GemmRoofline(), "elementwise": RooflineTable({"*": [1.0, 1e-4]})}
    )
    perf = PerfModel({}, models, Overheads())
    t_dcn, t_dot = perf.predict_ops(dcn)["per_batch_us"], perf.predict_ops(dot)["per_batch_us"]
    assert t_dcn > t_dot > 0


def test_the_report_holds_dcn_next_to_the_same_dot_configuration():
    configs = dict(heldout_configs())
    dcn = [name for name, c in configs.items() if c.get("arch_interaction_op") == "dcn"]
    assert dcn and all(name.removesuffix("-dcn") in configs for name in dcn)
    quick = dict(heldout_configs(quick=True))
    assert any(name.endswith("-dcn") and name.removesuffix("-dcn") in quick for name in quick)

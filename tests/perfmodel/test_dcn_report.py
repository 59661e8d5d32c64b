"""The report's dot/DCN comparison: matched pairs, the cross layers' GEMMs told apart from the
MLPs', and the per-interaction errors."""

from __future__ import annotations

import pytest

from perfmodel.fit_traces import FIT_CONFIGS
from perfmodel.interactions import dot_partner, interaction_of, is_cross_gemm, summary
from perfmodel.report import all_configs, dcn_configs


def test_every_dcn_configuration_has_its_dot_partner_and_nothing_is_a_fit_configuration():
    configs = dcn_configs()
    dots = [c for _, c in configs if interaction_of(c) == "dot"]
    dcns = [c for _, c in configs if interaction_of(c) == "dcn"]
    assert len(dcns) >= 6 and {(c["dcn_num_layers"], c["dcn_low_rank_dim"]) for c in dcns} >= {
        (3, 128), (1, 32), (2, 256)
    }  # fmt: skip
    assert all(dot_partner(c) in dots for c in dcns)
    assert {c["precision"] for c in dcns} == {"fp32", "bf16"}
    # held out: no fit trace has their batch sizes or MLPs
    assert not {c["mini_batch_size"] for c in FIT_CONFIGS} & {c["mini_batch_size"] for c in dots}
    mlps = lambda c: (tuple(c["arch_mlp_bot"]), tuple(c["arch_mlp_top"]))  # noqa: E731
    assert not {mlps(c) for c in FIT_CONFIGS} & {mlps(c) for c in dots}
    # a name means one configuration across the default report and the DCN one (rescore)
    by_name = dict(all_configs())
    assert all(by_name[n] == c for n, c in configs)


def _gemm(name, op, shapes=((4, 4), (4, 4))):
    return {"name": name, "op": op, "shapes": [list(s) for s in shapes],
            "strides": [[s[-1], 1][-len(s):] for s in shapes], "dtypes": ["float"] * len(shapes)}  # fmt: skip


def test_cross_layer_gemms_are_the_bias_free_linears():
    assert is_cross_gemm(_gemm("aten::mm", "aten::linear#0"))
    assert is_cross_gemm(_gemm("aten::mm", "autograd::engine::evaluate_function: MmBackward0#1"))
    assert not is_cross_gemm(_gemm("aten::addmm", "aten::linear#0", ((4,), (4, 4), (4, 4))))
    assert not is_cross_gemm(
        _gemm("aten::mm", "autograd::engine::evaluate_function: AddmmBackward0#0")
    )
    assert not is_cross_gemm(
        _gemm("aten::mm", "autograd::engine::evaluate_function: _PaddedLinearFnBackward#0")
    )
    assert not is_cross_gemm({"name": "aten::mul", "op": "aten::linear#0"})


def test_summary_matches_each_dcn_row_with_its_dot_row():
    dot = {"mini_batch_size": 64, "precision": "fp32"}
    configs = [
        ("a", dot),
        ("a-dcn", {**dot, "arch_interaction_op": "dcn", "dcn_num_layers": 2, "dcn_low_rank_dim": 8}),
        ("a-dcn1", {**dot, "arch_interaction_op": "dcn", "dcn_num_layers": 1, "dcn_low_rank_dim": 4}),
        ("b", {**dot, "mini_batch_size": 128}),  # no DCN partner: not in the dot figures
    ]  # fmt: skip
    rows = [{"config": n, "predicted_us": p, "measured_us": 100.0, "error": p / 100.0 - 1}
            for n, p in (("a", 110.0), ("a-dcn", 80.0), ("a-dcn1", 95.0), ("b", 200.0))]  # fmt: skip
    kernels = [
        ("a-dcn", _gemm("aten::mm", "aten::linear#0"), 12.0, 10.0),
        ("a-dcn", _gemm("aten::mm", "autograd::engine::evaluate_function: MmBackward0#0"), 5.0, 10.0),
        ("a-dcn", _gemm("aten::addmm", "aten::linear#0", ((4,), (4, 4), (4, 4))), 9.0, 10.0),
        ("a", _gemm("aten::addmm", "aten::linear#0", ((4,), (4, 4), (4, 4))), 11.0, 10.0),
    ]  # fmt: skip
    out = summary(configs, rows, kernels)
    assert [(p["dcn"], p["dot"]) for p in out["pairs"]] == [("a-dcn", "a"), ("a-dcn1", "a")]
    assert out["dot"]["n"] == 1 and out["dot"]["worst_abs"] == pytest.approx(0.1)
    assert out["dcn"]["n"] == 2
    assert out["dcn"]["median_abs"] == pytest.approx(0.125)  # of 20% and 5%
    assert out["dcn"]["worst_abs"] == pytest.approx(0.2) and out["dcn"]["worst"] == "a-dcn"
    cross = out["cross_layer_gemms"]
    assert cross["all"]["n"] == 2 and cross["all"]["worst_abs"] == pytest.approx(0.5)
    assert cross["fp32 forward"]["n"] == 1 and cross["fp32 backward"]["n"] == 1
    assert out["mlp_gemms_of_dcn_steps"]["all"]["n"] == 1
    assert summary(configs[:1] + configs[3:], rows, kernels) is None  # no DCN row: no comparison

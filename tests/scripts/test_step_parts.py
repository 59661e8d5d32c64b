"""scripts/step_parts.py: a step's operators put in parts that add up to the step. No timings
are asserted."""

import importlib.util
import json
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "step_parts", Path(__file__).resolve().parents[2] / "scripts" / "step_parts.py"
)
parts = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(parts)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.mark.parametrize(
    "op, part",
    [
        ({"name": "aten::linear", "phase": "forward"}, "gemm"),
        ({"name": "autograd::engine::evaluate_function: AddmmBackward0", "phase": "backward"}, "gemm"),
        ({"name": "aten::bmm", "phase": "forward"}, "interaction"),
        ({"name": "autograd::engine::evaluate_function: _DotInteractionFnBackward",
          "phase": "backward"}, "interaction"),
        ({"name": "aten::linear", "phase": "embedding_lookup"}, "embedding"),
        ({"name": "fbgemm::split_embedding_codegen_lookup_sgd_function_cpu", "phase": "backward"},
         "embedding"),
        ({"name": "aten::_to_copy", "phase": "forward"}, "casts"),
        ({"name": "aten::add_", "phase": "optimizer"}, "optimizer"),
        ({"name": "aten::relu", "phase": "forward"}, "other"),
    ],
)  # fmt: skip
def test_an_operator_is_in_one_part_by_its_phase_and_name(op, part):
    assert parts.part_of(op) == part


def test_the_parts_add_up_to_the_step(capsys):
    assert parts.main(["--batch-sizes", "64", "--precisions", "fp32", "--table-scale", "0.0005",
                       "--warmup", "1", "--steps", "2"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    case = out["cases"]["b64-fp32"]
    assert sum(case["parts_us"].values()) == pytest.approx(case["step_us"], rel=0.05)
    assert case["parts_us"]["gemm"] > 0 and case["parts_us"]["embedding"] > 0
    assert out["cpu_flags"] is not None and out["load_before"]

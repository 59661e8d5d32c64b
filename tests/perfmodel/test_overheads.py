import pytest

from perfmodel.overheads import Overheads, op_key


def _k(name, start, dur, n_events=1):
    return {
        "name": name,
        "stream": "cpu",
        "start_us": start,
        "dur_us": dur,
        "n_events": n_events,
        "launch_us": 0.0,
    }


def _doc(cost=0.0):
    ops = [
        # T1 before = 10 (from step start), T2 = 2, T5 = 3, T3 = 1
        {"name": "aten::linear", "phase": "forward", "thread": 1, "start_us": 10.0, "dur_us": 26.0, "n_events": 4,
         "shapes": [], "kernels": [_k("aten::copy_", 12.0, 5.0), _k("aten::addmm", 20.0, 15.0)]},
        # T1 = 4, no kernels: all host time (T2 = 6)
        {"name": "aten::view", "phase": "forward", "thread": 1, "start_us": 40.0, "dur_us": 6.0, "n_events": 1,
         "shapes": [], "kernels": []},
        # T1 = 4, T2 = 2, T3 = 2
        {"name": "aten::linear", "phase": "forward", "thread": 1, "start_us": 50.0, "dur_us": 24.0, "n_events": 4,
         "shapes": [], "kernels": [_k("aten::copy_", 52.0, 5.0), _k("aten::addmm", 60.0, 12.0)]},
    ]  # fmt: skip
    meta = {"batch_size": 4, "profiler_event_cost_us": cost}
    return {
        "format": "hybrid-dlrm/perf-trace",
        "version": 1,
        "meta": meta,
        "steps": [{"dur_us": 80.0, "ops": ops}],
    }


def test_statistics_of_the_five_kinds():
    ov = Overheads.from_traces([_doc()])
    lin = ov.table[op_key(_doc()["steps"][0]["ops"][0])]
    assert lin["T1"]["count"] == 2 and lin["T1"]["mean"] == pytest.approx(7.0)
    assert lin["T2"]["mean"] == pytest.approx(2.0) and lin["T2"]["std"] == pytest.approx(0.0)
    assert lin["T3"]["mean"] == pytest.approx(1.5)
    assert lin["T5"]["mean"] == pytest.approx(3.0) and lin["T5"]["count"] == 2
    assert lin["T4"]["mean"] == 0.0 and lin["T4"]["count"] == 4
    assert ov.table["aten::view|"]["T2"]["mean"] == pytest.approx(6.0)
    assert ov.step_end() == pytest.approx(6.0)
    # lookups fall back from the op key to the name to everything
    assert ov.get(
        {"name": "aten::linear", "kernels": [{"name": "aten::addmm"}]}, "T2"
    ) == pytest.approx(2.0)
    assert ov.get({"name": "never::seen", "kernels": []}, "T1") == pytest.approx(4.0)


def test_profiler_cost_is_subtracted():
    plain = Overheads.from_traces([_doc()])
    corrected = Overheads.from_traces([_doc(cost=1.0)])
    key = op_key(_doc()["steps"][0]["ops"][0])
    # two host events per linear (4 events, 2 kernels) cost 2 us of its 6 (7) us of host spans
    assert plain.table[key]["T2"]["mean"] == pytest.approx(2.0)
    assert corrected.table[key]["T2"]["mean"] == pytest.approx((2 * 4 / 6 + 2 * 5 / 7) / 2)
    assert corrected.table[key]["T1"]["mean"] == pytest.approx(6.0)
    assert Overheads.from_json(corrected.to_json()).table == corrected.table


def test_a_cuda_ops_host_time_is_its_launches_and_the_rest():
    from perfmodel.overheads import op_overheads

    op = {"name": "aten::linear", "start_us": 100.0, "dur_us": 30.0, "n_events": 4,
          "kernels": [{"name": "aten::addmm", "stream": "cuda:0", "start_us": None, "dur_us": 500.0,
                       "launch_us": 6.0, "n_events": 1},
                      {"name": "aten::add_", "stream": "cuda:0", "start_us": None, "dur_us": 20.0,
                       "launch_us": 4.0, "n_events": 1}]}  # fmt: skip
    out = op_overheads(op, prev_end=90.0, event_cost=1.0)
    assert out["T1"] == [9.0]
    assert out["T4"] == [6.0, 4.0]
    assert out["T2"] == [30.0 - 10.0 - 4 * 1.0]  # the device's 520 us are not host time


def _sized_doc(numel, t2):
    """`_doc` with kernels that move `numel` floats and the linear ops' T2 set to t2 (their
    kernels moved later by t2 - 2, still inside the op)."""
    import copy

    doc = copy.deepcopy(_doc())
    for op in doc["steps"][0]["ops"]:
        for k in op["kernels"]:
            k.update(shapes=[[numel], [numel]], dtypes=["float", "float"])
            k["start_us"] += t2 - 2.0
        if op["kernels"]:
            op["dur_us"] += t2 - 2.0
    return doc


def test_overheads_are_read_at_the_predicted_steps_working_set():
    """Fit steps that move more have longer host spans (allocation of larger tensors): a
    prediction reads the fit steps nearest its own step's dense working set; without a step,
    the pooled median as before."""
    from perfmodel.features import step_dense_bytes

    small, large = _sized_doc(1_000, 2.0), _sized_doc(1_000_000, 20.0)
    ov = Overheads.from_traces([small, large])
    first = small["steps"][0]["ops"][0]
    size = lambda d: step_dense_bytes(k for op in d["steps"][0]["ops"] for k in op["kernels"])  # noqa: E731
    assert ov.get(first, "T2", size(small)) == pytest.approx(2.0)
    assert ov.get(first, "T2", size(large)) == pytest.approx(20.0)
    assert ov.get(first, "T2", size(small) / 10) == pytest.approx(2.0)  # below the fitted range
    assert ov.get(first, "T2", size(large) * 10) == pytest.approx(20.0)  # above it
    assert 2.0 < ov.get(first, "T2", (size(small) * size(large)) ** 0.5) < 20.0
    pooled = ov.get(first, "T2")
    assert pooled == ov.table[op_key(first)]["T2"]["median"]
    # the points survive the model file
    again = Overheads.from_json(ov.to_json())
    assert again.get(first, "T2", size(large)) == pytest.approx(20.0)
    assert again.step_end(size(small)) == pytest.approx(6.0)
    assert again.step_end(size(large)) == pytest.approx(0.0)  # its last op ends after 80 us

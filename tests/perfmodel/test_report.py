"""The report's combination of several measurements of one configuration."""

from __future__ import annotations

import pytest

from perfmodel.report import combine_passes


def _rec(name, shape, op, dur, n_events=1, cost=0.0):
    return {"name": name, "shapes": [shape], "op": op, "dur_us": dur, "n_events": n_events,
            "event_cost_us": cost}  # fmt: skip


def test_combine_passes_takes_each_kernels_median_over_the_passes():
    passes = [
        [_rec("aten::mm", [4, 4], "linear#0", 10.0), _rec("aten::add", [4], "a#0", 2.0),
         _rec("aten::add", [4], "a#0", 3.0)],
        [_rec("aten::mm", [4, 4], "linear#0", 14.0), _rec("aten::add", [4], "a#0", 4.0),
         _rec("aten::add", [4], "a#0", 5.0)],
        [_rec("aten::mm", [4, 4], "linear#0", 11.0), _rec("aten::add", [4], "a#0", 1.0),
         _rec("aten::add", [4], "a#0", 9.0)],
    ]  # fmt: skip
    recs, times = combine_passes(passes)
    # the two adds of the same shape in the same op are told apart by their order
    assert [r["dur_us"] for r in recs] == [11.0, 2.0, 5.0]
    assert times[("aten::add", "[[4]]", "a#0", 2)] == [3.0, 5.0, 9.0]
    assert recs[0]["shapes"] == [[4, 4]] and passes[0][0]["dur_us"] == 10.0  # inputs untouched


def test_combine_passes_subtracts_nested_profiler_events_before_the_median():
    one = [_rec("aten::sum", [8, 8], "s#0", 20.0, n_events=3, cost=2.0)]
    two = [_rec("aten::sum", [8, 8], "s#0", 30.0, n_events=3, cost=2.0)]
    recs, _ = combine_passes([one, two])
    assert recs[0]["dur_us"] == pytest.approx(21.0)  # median of 16 and 26
    assert recs[0]["n_events"] == 1


def test_combine_passes_keeps_a_kernel_seen_in_one_pass_only():
    recs, times = combine_passes([[_rec("aten::fill_", [3], "f#0", 5.0)], []])
    assert [r["dur_us"] for r in recs] == [5.0]
    assert len(times[("aten::fill_", "[[3]]", "f#0", 1)]) == 1


def test_trace_paths_in_pass_order_or_the_single_trace(tmp_path):
    from perfmodel.report import trace_paths

    for p in (0, 1, 2, 10):
        (tmp_path / f"small-b128-fp32.pass{p}.trace.json").write_text("{}")
    (tmp_path / "small-b128-fp32-fae.pass0.trace.json").write_text("{}")  # another config
    (tmp_path / "kaggle-b256-fp32.trace.json").write_text("{}")
    names = [p.name for p in trace_paths(tmp_path, "small-b128-fp32")]
    assert names == [f"small-b128-fp32.pass{p}.trace.json" for p in (0, 1, 2, 10)]
    assert [p.name for p in trace_paths(tmp_path, "kaggle-b256-fp32")] == [
        "kaggle-b256-fp32.trace.json"
    ]
    assert trace_paths(tmp_path, "wide-b512-fp32") == []


def test_no_fit_configuration_shares_a_batch_size_or_mlp_with_a_held_out_one():
    """The report's configurations are held out: no fit trace has their MLP shapes, and none
    their batch sizes (the embedding lookups and the loss depend on the batch only)."""
    from perfmodel.fit_traces import FIT_CONFIGS
    from perfmodel.report import heldout_configs

    held = [c for _, c in heldout_configs()]
    assert len(held) >= 12
    fit_batches = {c["mini_batch_size"] for c in FIT_CONFIGS}
    assert not fit_batches & {c["mini_batch_size"] for c in held}
    mlps = lambda c: (tuple(c["arch_mlp_bot"]), tuple(c["arch_mlp_top"]))  # noqa: E731
    fit_mlps = {mlps(c) for c in FIT_CONFIGS}
    assert not fit_mlps & {mlps(c) for c in held}

"""The communication model's pieces that need no process group: wire bytes of a collective from
its arguments, and the latency-bandwidth fit. (The counting itself runs in
tests/dlrm/test_distributed.py's two processes.)"""

import pytest
import torch

from perfmodel.collectives import CollectiveModel, Record, _line, _wire_bytes


def test_wire_bytes_leave_out_what_a_rank_keeps():
    x = torch.zeros(10, 4)  # 160 bytes
    # an all-to-all: rank 1 keeps its own split (7 of 10 rows), sends the other 3
    assert _wire_bytes("all_to_all_single", (None, x, None, [3, 7]), {}, 2, 1) == (160, 48)
    assert _wire_bytes("all_to_all_single", (None, x), {}, 2, 0) == (160, 80)  # equal splits
    # a ring all-reduce sends 2 (W-1)/W of the payload
    assert _wire_bytes("all_reduce", (x,), {}, 4, 0) == (160, 240)
    parts = [torch.zeros(3), torch.zeros(5)]
    assert _wire_bytes("all_to_all", (None, parts), {}, 2, 1) == (32, 12)


def test_the_fit_recovers_latency_and_bandwidth():
    points = [(b, 2e-4 + b / 1e9) for b in (1e3, 1e5, 1e7)]
    fit = _line(points)
    assert fit["latency_s"] == pytest.approx(2e-4, rel=1e-6)
    assert fit["bytes_per_s"] == pytest.approx(1e9, rel=1e-6)
    model = CollectiveModel({"all_reduce": fit})
    calls = [Record("all_reduce", "all_reduce_dense", 0, 10**6), Record("barrier", "other", 0, 0)]
    assert model.predict_s(calls) == pytest.approx(2e-4 + 1e-3)

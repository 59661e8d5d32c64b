import pytest

from perfmodel.critical_path import traverse


def _op(name, kernels, stream="cpu", sync=False, phase="forward"):
    return {"name": name, "phase": phase, "sync": sync,
            "kernels": [{"name": k, "stream": stream} for k in kernels]}  # fmt: skip


KT = {"aten::addmm": 100.0, "aten::mm": 50.0, "aten::copy_": 10.0}
OV = {"T1": 5.0, "T2": 3.0, "T3": 2.0, "T4": 1.0, "T5": 4.0}


def test_cpu_graph_is_the_sum_of_host_and_kernel_time():
    ops = [_op("a", ["aten::addmm"]), _op("b", ["aten::copy_", "aten::mm"]), _op("view", [])]
    out = traverse(ops, lambda k: KT[k["name"]], lambda op, kind: OV[kind], step_end_us=7.0)
    # a: 5+3+1+100+2; b: 5+3+1+10+4+1+50+2; view: 5+3+2; tail 7
    assert out["per_batch_us"] == pytest.approx(111 + 76 + 10 + 7)
    assert out["device_active_us"] == {"cpu": 160.0}
    assert out["breakdown"]["overhead_us"]["T5"] == 4.0
    assert out["breakdown"]["kernel_type_us"] == {"gemm": 150.0, "elementwise": 10.0}


def test_async_stream_overlaps_host_until_a_sync():
    ops = [
        _op("a", ["aten::addmm"], stream="cuda:7"),  # launched at 9, runs 9..109
        _op("b", ["aten::mm"], stream="cuda:7"),  # host reaches 20+9=... queued behind a
        _op("item", [], stream="cuda:7", sync=True),
        _op("c", ["aten::copy_"], stream="cuda:7", phase="optimizer"),
    ]
    out = traverse(ops, lambda k: KT[k["name"]], lambda op, kind: OV[kind])
    # host: a 5+3+1=9 launch, +2 =11; b 11+5+3+1=20 launch (device busy until 109 -> 109..159), +2=22
    # item: 22+5+3+2=32, sync -> 159; c: 159+5+3+1=168 launch, runs 168..178, host 170
    assert out["host_us"] == pytest.approx(170.0)
    assert out["per_batch_us"] == pytest.approx(178.0)
    assert out["device_active_total_us"] == pytest.approx(160.0)


def test_two_streams_run_concurrently():
    ops = [_op("a", ["aten::addmm"], stream="cuda:1"), _op("b", ["aten::addmm"], stream="cuda:2")]
    zero = lambda op, kind: 0.0  # noqa: E731
    out = traverse(ops, lambda k: KT[k["name"]], zero)
    assert out["per_batch_us"] == pytest.approx(100.0)
    assert out["device_active_total_us"] == pytest.approx(200.0)

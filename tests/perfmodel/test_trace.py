import json

import pytest
import torch

from dlrm import Trainer
from dlrm.errors import ConfigError
from dlrm.pipelines.base import StepHook, TrainPipeline
from perfmodel import trace as tr
from perfmodel.profiling import profile_steps
from perfmodel.recorder import StepRecorder
from tests.dlrm.conftest import tiny


def _doc():
    op = {"name": "aten::linear", "phase": "forward", "thread": 1, "start_us": 1.0, "dur_us": 10.0,
          "n_events": 3, "shapes": [[4, 3], [2, 3], [2]], "dtypes": ["float"] * 3, "sync": False,
          "kernels": [{"name": "aten::addmm", "stream": "cpu", "start_us": 3.0, "dur_us": 6.0,
                       "n_events": 1, "launch_us": 0.0, "shapes": [[2], [4, 3], [3, 2]],
                       "strides": [[1], [3, 1], [1, 3]], "dtypes": ["float"] * 3}]}  # fmt: skip
    return tr.make_doc({"batch_size": 4, "precision": "fp32"}, [{"dur_us": 12.0, "ops": [op]}])


def test_trace_round_trip(tmp_path):
    doc = _doc()
    path = tr.write_trace(doc, tmp_path / "a.trace.json")
    assert tr.read_trace(path) == json.loads(json.dumps(doc))
    assert tr.trace_files([tmp_path]) == [path]


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(format="other"), "not a hybrid-dlrm/perf-trace file"),
        (lambda d: d.update(version=99), "version 99"),
        (lambda d: d["meta"].pop("batch_size"), "meta.batch_size"),
        (lambda d: d["steps"][0]["ops"][0].pop("kernels"), "has no kernels"),
        (lambda d: d["steps"][0]["ops"][0].update(phase="sideways"), "phase 'sideways'"),
        (lambda d: d["steps"][0]["ops"][0]["kernels"][0].pop("stream"), "has no stream"),
    ],
)
def test_schema_errors_name_the_problem(tmp_path, mutate, message):
    doc = _doc()
    mutate(doc)
    path = tmp_path / "bad.trace.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(tr.TraceError, match=message):
        tr.read_trace(path)


def test_unreadable_files(tmp_path):
    with pytest.raises(tr.TraceError, match="no such file"):
        tr.read_trace(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(tr.TraceError, match="not JSON"):
        tr.read_trace(tmp_path / "x.json")


def test_profiled_toy_step_has_phases_and_kernels():
    """Labels come through the pipeline's step hook: any TrainPipeline gets them."""
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    class Toy(TrainPipeline):
        def __init__(self):
            self.model, self.hook = model, StepHook()

        def progress(self, batches):
            x = next(batches)

            def run():
                with self.hook.phase("forward"):
                    loss = model(x).sum()
                opt.zero_grad()
                with self.hook.phase("backward"):
                    loss.backward()
                with self.hook.phase("optimizer"):
                    opt.step()

            return self.hook.step(x, run)

    toy = Toy()
    graphs = profile_steps(toy, [torch.randn(8, 5)] * 2, uses_cuda=False)
    assert isinstance(toy.hook, StepHook) and type(toy.hook) is StepHook  # put back
    assert len(graphs) == 2
    ops = graphs[0]["ops"]
    phases = {op["phase"] for op in ops}
    assert {"forward", "backward", "optimizer"} <= phases
    kernels = [k["name"] for op in ops for k in op["kernels"]]
    assert "aten::addmm" in kernels and "aten::mm" in kernels
    assert torch.Tensor.backward.__name__ == "backward"  # nothing of torch was patched
    assert "step" not in vars(opt)
    starts = [op["start_us"] for op in ops]
    assert starts == sorted(starts) and all(op["dur_us"] >= 0 for op in ops)


def test_trainer_perf_log_writes_a_trace_and_costs_nothing_when_off(tmp_path):
    off = Trainer(tiny(tmp_path, num_batches=2))
    assert type(off.pipeline.hook) is StepHook  # does nothing
    with pytest.raises(
        ConfigError, match=r"^perf_log: pass the hook that records it, Trainer\(cfg, step_hook="
    ):
        Trainer(tiny(tmp_path, perf_log=str(tmp_path / "perf"), out_dir=str(tmp_path / "r1")))
    cfg = tiny(
        tmp_path, num_batches=11, perf_log=str(tmp_path / "perf"), out_dir=str(tmp_path / "run2")
    )
    recorder = StepRecorder(cfg.perf_log)
    Trainer(cfg, step_hook=recorder).fit()
    doc = tr.read_trace(tmp_path / "perf" / "trace-rank0.trace.json")
    assert doc["meta"]["batch_size"] == 64 and len(doc["steps"]) == recorder.steps
    assert doc["meta"]["unprofiled_step_cpu_us"] > 0
    names = {k["name"] for st in doc["steps"] for op in st["ops"] for k in op["kernels"]}
    assert any("split_embedding" in n for n in names) and "aten::bmm" in names
    assert {op["phase"] for op in doc["steps"][0]["ops"]} >= {
        "forward",
        "embedding_lookup",
        "loss",
        "backward",
    }


class _Ev:
    """The parts of a torch.profiler FunctionEvent that the trace reader uses."""

    def __init__(self, name, start, end, children=(), kernels=(), shapes=None, dtypes=None):
        from collections import namedtuple

        self.name, self.thread = name, 1
        self.time_range = namedtuple("Interval", "start end")(start, end)
        self.cpu_children = list(children)
        self.cpu_parent = None
        for c in self.cpu_children:
            c.cpu_parent = self
        Kernel = namedtuple("Kernel", "name device duration")
        self.kernels = [Kernel(n, 0, d) for n, d in kernels]
        self.input_shapes, self.input_dtypes = shapes or [], dtypes or []
        self.concrete_inputs, self.structured_input_strides = [], []


def test_cuda_kernels_are_the_compute_ops_with_their_device_time():
    """On CUDA a kernel record is the compute op (name, shapes, dtypes: what the kernel models
    read) with the summed time of the device kernels its launch calls started; a compute op that
    launched nothing ran on the host; device work outside every compute op is kept too."""
    addmm = _Ev("aten::addmm", 12, 30, shapes=[[2], [4, 3], [3, 2]], dtypes=["float"] * 3, children=[
        _Ev("cudaLaunchKernel", 14, 19, kernels=[("sm90_gemm", 40.0)]),
        _Ev("cudaLaunchKernel", 20, 24, kernels=[("splitk_reduce", 5.0)])])  # fmt: skip
    host_op = _Ev("aten::index_select", 31, 40, shapes=[[100, 16], [], [8]])
    stray = _Ev(
        "aten::weird_wrapper",
        41,
        45,
        children=[_Ev("cudaLaunchKernel", 42, 43, kernels=[("fill", 2.0)])],
    )
    direct = _Ev("cudaLaunchKernel", 46, 47, kernels=[("copy", 3.0)])
    linear = _Ev(
        "aten::linear",
        10,
        50,
        children=[addmm, host_op, stray, direct],
        shapes=[[4, 3], [2, 3], [2]],
    )
    step = _Ev(tr.STEP_LABEL, 0, 100, children=[linear])
    events = [step, linear, addmm, *addmm.cpu_children, host_op, stray, *stray.cpu_children, direct]
    [graph] = tr.graph_from_events(events, uses_cuda=True)
    [op] = graph["ops"]
    gemm, host, wrapper, rest = op["kernels"]
    assert (gemm["name"], gemm["stream"], gemm["dur_us"]) == ("aten::addmm", "cuda:0", 45.0)
    assert gemm["shapes"] == [[2], [4, 3], [3, 2]] and gemm["launch_us"] == 9.0
    assert gemm["device_kernels"] == ["sm90_gemm", "splitk_reduce"]
    assert (host["name"], host["stream"], host["dur_us"]) == ("aten::index_select", "cpu", 9.0)
    assert (wrapper["name"], wrapper["stream"], wrapper["dur_us"]) == (
        "aten::weird_wrapper",
        "cuda:0",
        2.0,
    )
    assert (rest["name"], rest["stream"], rest["dur_us"]) == ("aten::linear", "cuda:0", 3.0)
    [cpu_graph] = tr.graph_from_events(events, uses_cuda=False)
    assert [k["name"] for k in cpu_graph["ops"][0]["kernels"]] == [
        "aten::addmm",
        "aten::index_select",
        "aten::weird_wrapper",
    ]


def test_device_kernel_times_are_not_corrected_for_host_effects():
    """The profiler's per-event cost and the host thread's descheduling are host time: a CPU
    kernel's duration is corrected for them, a CUDA kernel's (device time) is not."""
    from perfmodel.graph import corrected_us, records_from_trace

    def kernel(stream):
        return {"name": "aten::addmm", "stream": stream, "start_us": None if stream != "cpu" else 1.0,
                "dur_us": 4000.0, "n_events": 5, "launch_us": 0.0, "shapes": [[2], [4, 3], [3, 2]],
                "strides": [], "dtypes": ["float"] * 3}  # fmt: skip

    steps = [{"dur_us": 9000.0, "wall_us": 9000.0, "cpu_us": 4500.0,
              "ops": [{"name": "aten::linear", "phase": "forward", "start_us": 0.0, "dur_us": 4100.0,
                       "n_events": 6, "shapes": [], "kernels": [kernel("cpu"), kernel("cuda:0")]}]}] * 3  # fmt: skip
    doc = tr.make_doc({"batch_size": 4, "profiler_event_cost_us": 10.0}, steps)
    host, device = records_from_trace(doc)
    assert host["dur_us"] == 2000.0  # a long host kernel in steps that had half the core
    assert device["dur_us"] == 4000.0
    assert corrected_us(host) == 2000.0 - 4 * 10.0  # its 4 nested profiler events
    assert corrected_us(device) == 4000.0


def test_kernel_records_carry_their_steps_dense_working_set():
    """Each kernel record holds the bytes its step's dense kernels move (the in-situ factors'
    step context); steps whose ops differ (FAE's hot and cold batches) each have their own."""
    from perfmodel.features import bytes_moved, step_dense_bytes
    from perfmodel.graph import records_from_trace

    def kernel(name, shape):
        return {"name": name, "stream": "cpu", "start_us": 1.0, "dur_us": 10.0, "n_events": 1,
                "launch_us": 0.0, "shapes": [shape, shape], "strides": [], "dtypes": ["float"] * 2}  # fmt: skip

    def step(*kernels):
        return {"dur_us": 100.0, "wall_us": 100.0, "cpu_us": 100.0,
                "ops": [{"name": k["name"], "phase": "forward", "start_us": 0.0, "dur_us": 20.0,
                         "n_events": 2, "shapes": [], "kernels": [k]} for k in kernels]}  # fmt: skip

    relu, add = kernel("aten::relu", [64, 32]), kernel("aten::add", [64, 32])
    emb = kernel("fbgemm::split_embedding_codegen_forward_unweighted_cpu", [4096])
    doc = tr.make_doc({"batch_size": 64}, [step(relu, emb), step(relu, emb, add), step(relu, emb)])
    recs = records_from_trace(doc)
    assert len(recs) == 5
    one, two = bytes_moved(relu), bytes_moved(relu) + bytes_moved(add)
    assert [r["step_bytes"] for r in recs] == [one, one, two, two, two]
    assert step_dense_bytes([relu, emb, add]) == two  # the lookup's table reads are not dense


def test_the_traversal_predicts_each_kernel_in_its_steps_context():
    from perfmodel.features import step_dense_bytes
    from perfmodel.kernel_models import RooflineTable
    from perfmodel.kernels import KernelModels
    from perfmodel.model import PerfModel
    from perfmodel.overheads import Overheads

    seen = []

    class Recording(KernelModels):
        def predict(self, k, step_bytes=None):
            seen.append(step_bytes)
            return 1.0

    model = PerfModel({}, Recording({"elementwise": RooflineTable({"*": [1.0, 0.0]})}), Overheads())
    ks = [{"name": "aten::relu", "shapes": [[1000]], "dtypes": ["float"]},
          {"name": "aten::add", "shapes": [[500], [500]], "dtypes": ["float"] * 2}]  # fmt: skip
    out = model.predict_ops([{"name": "a", "kernels": ks[:1]}, {"name": "b", "kernels": ks[1:]}])
    assert out["per_batch_us"] == 2.0
    assert seen == [step_dense_bytes(ks)] * 2

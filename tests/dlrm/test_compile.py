"""`--compile` (dlrm/pipelines/compile.py): the dense part compiled by TorchInductor computes what the eager
model computes, compiles once for training and once for evaluation whatever the batch sizes,
resumes bit-exactly, and falls back to eager with one log line where it cannot compile.

Compiling costs seconds per graph, so the compiled runs are shared by the tests (module scope)."""

from __future__ import annotations

import logging

import pytest
import torch
from torch._dynamo.utils import counters

from dlrm.checkpoints import format as ckpt
from dlrm.pipelines import compile as compile_
from dlrm.train import config_from_args
from dlrm.trainer import Trainer
from tests.dlrm.conftest import tiny

# 10 full mini-batches of 64 and a short one of 20; evaluation in batches of 500 and a last of 48
SHAPES = dict(data_size=64 * 10 + 20, test_data_size=1048, test_mini_batch_size=500, test_freq=5)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny batches: threads cost more than they save on 2 shared cores
    yield
    torch.set_num_threads(threads)


def _fit(out, **kw) -> tuple[dict, Trainer]:
    trainer = Trainer(tiny(out, **{**SHAPES, "keep_checkpoints": 5, **kw}))
    return trainer.fit(), trainer


@pytest.fixture(scope="module")
def compiled_run(tmp_path_factory):
    torch._dynamo.reset()
    counters.clear()
    summary, trainer = _fit(tmp_path_factory.mktemp("compiled"), compile=True)
    graphs = counters["stats"]["unique_graphs"]
    return summary, trainer, graphs


def _params(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


@pytest.mark.usefixtures("long_training")
def test_compiled_training_equals_eager_and_compiles_once_per_mode(compiled_run, tmp_path):
    summary, trainer, graphs = compiled_run
    assert summary["compiled"] and summary["steps"] == 11
    # one graph for training (batches of 64 and the last of 20) and one for evaluation (500, 48)
    assert graphs == 2
    eager, eager_trainer = _fit(tmp_path, compile=False)
    assert not eager["compiled"]
    assert summary["test_auc"] == pytest.approx(eager["test_auc"], abs=1e-4)
    got, want = _params(trainer), _params(eager_trainer)
    assert got.keys() == want.keys()  # the state dict is the eager model's: no wrapper prefix
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=name)


def test_compiled_run_resumes_bit_exactly(compiled_run):
    summary, trainer, _ = compiled_run
    first = ckpt.list_checkpoints(trainer.ckpt_dir)[0]  # after step 5
    resumed, res_trainer = _fit(trainer.run_dir.parent, compile=True, resume=str(first))
    assert resumed["steps"] == summary["steps"] and resumed["test_auc"] == summary["test_auc"]
    for name, value in _params(trainer).items():
        assert torch.equal(_params(res_trainer)[name], value), name


def test_bf16_compiled_tracks_eager_bf16(tmp_path):
    eager, _ = _fit(tmp_path / "eager", precision="bf16", compile=False, num_batches=4)
    # 4 steps: too short for auto to compile bf16 (test_auto_compiles_bf16_where_it_pays)
    compiled, _ = _fit(tmp_path / "compiled", precision="bf16", compile=True, num_batches=4)
    assert compiled["compiled"]
    assert compiled["test_auc"] == pytest.approx(eager["test_auc"], abs=2e-3)


def test_fallback_to_eager_when_inductor_cannot_build(tmp_path, monkeypatch, caplog):
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "empty-cache"))
    # torch's own patch: monkeypatch's undo deletes a config entry rather than restoring it,
    # and every later compile in the session then fails ("fx_graph_cache does not exist")
    no_compiler = {"fx_graph_cache": False, "cpp.cxx": ("no-such-c++-compiler",)}
    with (
        inductor_config.patch(no_compiler),
        caplog.at_level(logging.WARNING, logger="dlrm.pipelines.compile"),
    ):
        fell_back, t1 = _fit(tmp_path / "a", compile=True, num_batches=3)
    lines = [r.getMessage() for r in caplog.records if r.name == "dlrm.pipelines.compile"]
    assert len(lines) == 1 and "runs eager" in lines[0] and "no-such-c++-compiler" in lines[0]
    assert not fell_back["compiled"]
    eager, t2 = _fit(tmp_path / "b", compile=False, num_batches=3)
    assert fell_back["test_auc"] == eager["test_auc"]
    for name, value in _params(t2).items():
        assert torch.equal(_params(t1)[name], value), name
    torch._dynamo.reset()


def test_compile_flag_and_auto(tmp_path):
    out = ["--out-dir", str(tmp_path / "x")]
    assert config_from_args(out + ["--compile"]).compile is True
    assert config_from_args(out + ["--compile=false"]).compile is False
    assert config_from_args(out + ["--compile=auto"]).compile is None
    assert config_from_args(out).compile is None
    assert compile_.wanted(None, "bf16") and not compile_.wanted(
        None, "fp32"
    )  # see test_dense_step
    assert compile_.wanted(True, "fp32") and not compile_.wanted(False, "bf16")


def test_auto_compiles_bf16_where_it_pays():
    n = compile_.BF16_AUTO_MIN_STEPS
    assert compile_.wanted(None, "bf16", 2048, n) and compile_.wanted(None, "bf16", 128, 10**6)
    assert not compile_.wanted(None, "bf16", 2048, n - 1)  # the compile would not pay
    assert not compile_.wanted(None, "bf16", 2048, 100)  # the issue's --num-batches 100
    assert compile_.wanted(True, "bf16", 2048, 100)


def test_bad_compile_value_is_one_line(tmp_path, capsys):
    from dlrm.train import main

    with pytest.raises(SystemExit) as e:
        main(["--compile=maybe", "--out-dir", str(tmp_path / "x")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--compile" in err[0] and "maybe" in err[0]


def test_perf_log_keeps_the_step_eager(tmp_path, caplog):
    cfg = tiny(tmp_path, compile=True, perf_log=str(tmp_path / "perf"))
    from perfmodel.recorder import StepRecorder

    with caplog.at_level(logging.WARNING, logger="dlrm.compose"):
        trainer = Trainer(cfg, step_hook=StepRecorder(cfg.perf_log))
    assert trainer.compiled is None
    assert any("--perf-log" in r.getMessage() for r in caplog.records)


class _OwnModel(torch.nn.Module):
    """A library user's model: the trainer's interface, but no dense_forward to compile."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    @property
    def embeddings(self):
        return self.inner.embeddings

    def dense_parameters(self):
        return self.inner.dense_parameters()

    def forward(self, dense, sparse):
        return self.inner(dense, sparse)


def test_a_model_without_dense_forward_trains_eager(tmp_path, caplog):
    donor = Trainer(tiny(tmp_path / "donor"), checkpoints=False)
    with caplog.at_level(logging.WARNING, logger="dlrm.pipelines.compile"):
        trainer = Trainer(tiny(tmp_path / "own", compile=True, num_batches=3),
                          data=donor.data, model=_OwnModel(donor.model))  # fmt: skip
    assert trainer.compiled is None
    assert [r.getMessage() for r in caplog.records if r.name == "dlrm.pipelines.compile"] == [
        "--compile: _OwnModel has no dense_forward(dense, pooled) to compile; it runs eager"
    ]
    assert trainer.fit()["steps"] == 3


@pytest.mark.gpu
def test_compiled_bf16_on_cuda_tracks_eager(tmp_path):
    """On CUDA Inductor emits Triton kernels: same check as on CPU (one graph per mode)."""
    torch._dynamo.reset()
    counters.clear()
    kw = dict(device="cuda", precision="bf16", num_batches=6, embedding_backend="torch")
    compiled, _ = _fit(tmp_path / "compiled", compile=True, **kw)
    assert compiled["compiled"] and counters["stats"]["unique_graphs"] == 2
    eager, _ = _fit(tmp_path / "eager", compile=False, **kw)
    assert compiled["test_auc"] == pytest.approx(eager["test_auc"], abs=2e-3)


def test_the_compile_notice_leaves_stdout_to_the_program(tmp_path, capsys):
    """A benchmark's JSON on stdout had the notice in it: a Trainer says it on stderr."""
    Trainer(tiny(tmp_path / "x", **{**SHAPES, "compile": True}))
    out, err = capsys.readouterr()
    assert out == "" and "--compile: the dense step compiles on the first step" in err

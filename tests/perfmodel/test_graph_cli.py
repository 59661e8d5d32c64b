import dataclasses
import json
import re

import pytest

from perfmodel.graph import B1, B2, instantiate
from perfmodel.model import ModelError, PerfModel


def _op(batch):
    return {"name": "aten::linear", "phase": "forward", "shapes": [[batch, 13], [64, 13], [64]],
            "kernels": [{"name": "aten::addmm", "stream": "cpu", "shapes": [[64], [batch, 13], [13, 64]],
                         "strides": [[1], [13, 1], [1, 13]], "out_shape": [batch * 26 + 1]}]}  # fmt: skip


def test_shapes_are_extrapolated_linearly_in_the_batch():
    template = {"meta": {"table_sizes": [3], "embedding_dim": 4}, "ops": [[_op(B1)], [_op(B2)]]}
    (op,) = instantiate(template, 4096)
    assert op["shapes"] == [[4096, 13], [64, 13], [64]]
    k = op["kernels"][0]
    assert k["shapes"][1] == [4096, 13] and k["out_shape"] == [4096 * 26 + 1]
    assert k["ctx"]["batch_size"] == 4096 and k["ctx"]["table_sizes"] == [3]


def test_cli_errors_are_one_line_exit_2(tmp_path, monkeypatch, capsys):
    from perfmodel.__main__ import main

    monkeypatch.setenv("HYBRID_DLRM_CACHE", str(tmp_path / "cache"))
    missing = str(tmp_path / "missing.json")
    cases = [
        (["fit", "--bench", str(tmp_path / "nothing")], "no microbenchmark records"),
        (["predict", "--model", missing], "no performance model"),
        (["report", "--model", missing], "no performance model"),
        (["report", "--passes", "0"], "--passes: expected a positive integer, got '0'"),
        (["report", "--from-traces", str(tmp_path)], "no held-out configuration traces"),
        (
            ["microbench", "--out", str(tmp_path / "mb"), "--sweeps", "mlp,bogus"],
            "--sweeps: unknown bogus",
        ),
        (["predict", "--precision", "fp64", "--model", missing], "--precision"),
        (["fit"], "--bench"),
        (["frobnicate"], "invalid choice"),
        (["plan", "--threads", "-1"], "--threads: expected 1 to "),
    ]
    for args, message in cases:
        try:
            code = main(args)
        except SystemExit as e:  # argparse's own errors
            code = e.code
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2, (args, err)
        assert len(err) == 1 and "error" in err[0] and message in err[0], (args, err)


def test_model_file_errors(tmp_path):
    bad = tmp_path / "m.json"
    bad.write_text(json.dumps({"format": "else"}))
    for path, msg in (
        (bad, "not a hybrid-perfmodel"),
        (tmp_path / "none.json", "no performance model"),
    ):
        try:
            PerfModel.load(path)
        except ModelError as e:
            assert msg in str(e)
        else:
            raise AssertionError("no error")


def test_cached_graphs_are_keyed_by_the_step_code(monkeypatch):
    """A graph captured before the model code changed must not be reused after."""
    from dlrm import TrainConfig
    from perfmodel import graph

    cfg = TrainConfig(arch_embedding_size=(10, 20), arch_mlp_bot=(13, 16), arch_mlp_top=(4, 1))
    before = graph.graph_key(cfg)
    assert graph.graph_key(dataclasses.replace(cfg, mini_batch_size=7)) == before
    monkeypatch.setattr(graph, "_step_code_fingerprint", lambda: "edited")
    assert graph.graph_key(cfg) != before


def test_measurements_wait_for_a_steady_machine(monkeypatch):
    """A run during which the canary is slow is repeated; the last attempt is kept regardless."""
    from perfmodel import hardware

    canary = iter([100.0, 100.0, 100.0, 300.0, 100.0, 100.0])  # us: run 1 steady, run 2 not
    monkeypatch.setattr(hardware, "canary_us", lambda dtype=None: next(canary))
    monkeypatch.setattr(hardware.time, "sleep", lambda s: None)
    runs = []
    result, slow = hardware.on_steady_machine(
        lambda: runs.append(1) or len(runs), {"canary_us": 100.0}
    )
    assert (result, slow, len(runs)) == (1, 1.0, 1)
    result, slow = hardware.on_steady_machine(
        lambda: runs.append(1) or len(runs), {"canary_us": 100.0}
    )
    assert (result, slow) == (3, 1.0)  # run 2 was followed by a 3x slow canary: run again
    always_slow = iter([300.0] * 10)
    monkeypatch.setattr(hardware, "canary_us", lambda dtype=None: next(always_slow))
    result, slow = hardware.on_steady_machine(lambda: "kept", {"canary_us": 100.0}, attempts=2)
    assert (result, slow) == ("kept", 3.0)


def test_each_microbenchmark_draw_is_gated_by_the_canary(monkeypatch):
    """A sweep's draws are measured through `SteadyGate`: a draw with a slow canary before it is
    not run until the canary is steady, one with a slow canary after it is run again, and the
    summary counts the retries and what was kept."""
    from perfmodel import hardware, sweeps

    # draw 1: before slow (wait), before ok, after ok -> kept at 1.0
    # draw 2: before ok, after 2x (run again), before ok, after 1.1 -> kept at 1.1
    canary = iter([300.0, 100.0, 100.0, 100.0, 200.0, 100.0, 110.0])
    monkeypatch.setattr(hardware, "canary_us", lambda dtype=None: next(canary))
    monkeypatch.setattr(hardware.time, "sleep", lambda s: None)
    gate = hardware.SteadyGate({"canary_us": 100.0})
    monkeypatch.setattr(sweeps, "_GATE", gate)
    calls = []
    sweeps.time_call(lambda: calls.append("a"), reps=1)
    sweeps.time_call(lambda: calls.append("b"), reps=1)
    assert calls == ["a", "a", "b", "b", "b", "b"]  # warm + 1 rep per run; draw 2 ran twice
    assert gate.slowdowns == [1.0, 1.1]
    summary = gate.summary()
    assert (summary["draws"], summary["retries"], summary["slow_draws"]) == (2, 2, 0)
    assert summary["max_slowdown"] == 1.1


def test_gemm_draws_carry_their_slowdown_and_are_fitted_at_the_described_speed(monkeypatch):
    """A timed GEMM record holds the canary slowdown of its draw; the fit divides the gemm
    sweep's durations by it and leaves the other sweeps' as measured."""
    import torch

    from perfmodel import hardware, sweeps

    canary = iter([100.0, 150.0])  # before, after: the draw ran at up to 1.5x
    monkeypatch.setattr(hardware, "canary_us", lambda dtype=None: next(canary))
    gate = hardware.SteadyGate({"canary_us": 100.0}, limit=2.0)
    monkeypatch.setattr(sweeps, "_GATE", gate)
    a = torch.randn(8, 8)
    rec = sweeps._timed_gemm("aten::mm", [a, a], lambda: torch.mm(a, a), 1, {})
    assert rec["machine_slowdown"] == 1.5 and rec["shapes"] == [[8, 8], [8, 8]]
    assert sweeps.at_described_speed(dict(rec, sweep="gemm"), 30.0) == pytest.approx(20.0)
    assert sweeps.at_described_speed(dict(rec, sweep="mlp"), 30.0) == 30.0
    assert sweeps.at_described_speed({"sweep": "gemm"}, 30.0) == 30.0  # no canary: as measured
    # a CUDA device's GEMM: the CPU canary says nothing about it
    assert sweeps.at_described_speed(dict(rec, sweep="gemm", stream="cuda:0"), 30.0) == 30.0
    assert "machine_slowdown_bf16" not in rec


def test_bf16_gemm_draws_are_fitted_at_the_bf16_canary_speed(monkeypatch):
    """A neighbour may slow fp32 matmuls and leave bf16 ones alone: a bf16 GEMM draw also
    records the bf16 canary's slowdown, measured after it, and is divided by that one."""
    import torch

    from perfmodel import hardware, sweeps

    def canary(dtype=torch.float32):
        return 150.0 if dtype == torch.float32 else 420.0  # fp32 1.5x, bf16 1.05x

    monkeypatch.setattr(hardware, "canary_us", canary)
    gate = hardware.SteadyGate({"canary_us": 100.0, "canary_bf16_us": 400.0}, limit=2.0)
    monkeypatch.setattr(sweeps, "_GATE", gate)
    a = torch.randn(8, 8).bfloat16()
    rec = sweeps._timed_gemm("aten::mm", [a, a], lambda: torch.mm(a, a), 1, {})
    assert rec["machine_slowdown"] == 1.5
    assert rec["machine_slowdown_bf16"] == pytest.approx(1.05)
    assert sweeps.at_described_speed(dict(rec, sweep="gemm"), 21.0) == pytest.approx(20.0)
    # a description without the bf16 canary: the draw is divided by the fp32 canary's slowdown
    monkeypatch.setattr(sweeps, "_GATE", hardware.SteadyGate({"canary_us": 100.0}, limit=2.0))
    rec = sweeps._timed_gemm("aten::mm", [a, a], lambda: torch.mm(a, a), 1, {})
    assert "machine_slowdown_bf16" not in rec
    assert sweeps.at_described_speed(dict(rec, sweep="gemm"), 30.0) == pytest.approx(20.0)


def test_a_cached_description_without_the_bf16_canary_gets_it_measured(tmp_path, monkeypatch):
    import torch

    from perfmodel import hardware

    monkeypatch.setattr(hardware, "canary_us", lambda dtype=torch.float32: 400.0)
    path = tmp_path / "hw.json"
    old = {"version": hardware.VERSION, "key": hardware.machine_key(), "canary_us": 100.0}
    path.write_text(json.dumps(old))
    desc = hardware.describe(path)
    assert desc["canary_bf16_us"] == 400.0 and desc["canary_us"] == 100.0
    assert json.loads(path.read_text())["canary_bf16_us"] == 400.0  # written back once


def test_a_slow_fit_trace_is_measured_again_and_the_steadier_kept(tmp_path, monkeypatch):
    from perfmodel import fit_traces

    slowdowns = iter([1.6, 1.05, 1.3, 1.9])  # fit0 slow, fit1 steady; fit0 again 1.3 (kept)
    written = []

    def fake_trace_config(cfg, out):
        slow = next(slowdowns)
        out.write_text(json.dumps({"meta": {"machine_slowdown": slow}}))
        written.append(out.name)
        return out, slow

    monkeypatch.setattr(fit_traces, "FIT_CONFIGS", [{}, {}])
    monkeypatch.setattr(fit_traces, "trace_config", fake_trace_config)
    assert fit_traces.fit_traces(tmp_path, 1) == [1.3, 1.05]
    assert written == ["fit0.trace.json", "fit1.trace.json", "fit0.retry"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fit0.trace.json", "fit1.trace.json"]
    assert json.loads((tmp_path / "fit0.trace.json").read_text())["meta"]["machine_slowdown"] == 1.3
    # a retry no steadier than the first measurement is dropped
    slowdowns = iter([1.6, 1.05, 1.9])
    assert fit_traces.fit_traces(tmp_path, 1) == [1.6, 1.05]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fit0.trace.json", "fit1.trace.json"]


def test_the_gate_stops_waiting_when_its_budget_is_spent(monkeypatch):
    from perfmodel import hardware

    monkeypatch.setattr(hardware, "canary_us", lambda dtype=None: 300.0)  # a long slow period
    slept = []
    monkeypatch.setattr(hardware.time, "sleep", slept.append)
    gate = hardware.SteadyGate({"canary_us": 100.0}, attempts=4, pause_s=1.0, wait_budget_s=5.0)
    runs = []
    for _ in range(4):
        gate.run(lambda: runs.append(1))
    assert len(runs) == 4  # every draw ran once, at the end of its tries or of the budget
    assert sum(slept) == 5.0 and gate.retries == 5
    assert gate.slowdowns == [3.0] * 4 and gate.summary()["slow_draws"] == 4


def test_the_cli_flushes_denormals_as_the_trainer_does(tmp_path, monkeypatch):
    """Microbenchmarks and held-out steps run with the trainer's CPU setting: a denormal operand
    would make oneDNN's bf16 kernels several times slower than in training."""
    import torch

    from perfmodel.__main__ import main

    monkeypatch.setenv("HYBRID_DLRM_CACHE", str(tmp_path / "cache"))
    torch.set_flush_denormal(False)
    try:
        assert main(["predict", "--model", str(tmp_path / "missing.json")]) == 2
        assert (torch.tensor([1e-39]) * 1.0).item() == 0.0
    finally:
        torch.set_flush_denormal(False)


def test_trainers_built_for_measuring_leave_nothing_behind(tmp_path):
    """An FAE trainer writes its access profile and plan (tens of MB at real sizes) into its run
    directory; the report builds dozens of them, so their directories go when the process ends."""
    import os
    import subprocess
    import sys

    code = """
from perfmodel.graph import build_trainer
from perfmodel.fit_traces import base_config
t = build_trainer(base_config(placement="fae", arch_embedding_size=(50, 80),
                              arch_mlp_bot=(13, 16), arch_mlp_top=(8, 1)))
import pathlib
print(sorted(p.name for p in pathlib.Path(t.cfg.out_dir).iterdir()))
"""
    env = dict(os.environ, TMPDIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "access_profile.npz" in out.stdout  # the trainer did write into its directory
    assert list(tmp_path.iterdir()) == []


def test_microbench_says_each_sweep_as_it_ends(tmp_path, monkeypatch, capsys):
    """Its stdout is one JSON object at the end of 10-15 minutes: stderr says what it does when
    it starts and after each sweep (the walk of the pages found it silent throughout)."""
    from perfmodel import hardware, microbench, sweeps

    monkeypatch.setattr(hardware, "describe", lambda refresh=False: {"key": "k", "canary_us": 1.0})
    monkeypatch.setattr(sweeps, "SWEEPS", {"gemm": lambda rng, n, reps: [{"us": 1.0}] * n,
                                           "loss": lambda rng, n, reps: []})  # fmt: skip
    monkeypatch.setattr(sweeps, "DEFAULT_COUNTS", {"gemm": 3, "loss": 1})
    microbench.run(tmp_path / "mb", fit_configs=False, device="cpu")
    err = [re.sub(r"in \d+\.\d s", "in T s", x) for x in capsys.readouterr().err.splitlines()]
    assert err == [
        f"microbench: 2 kernel sweeps (gemm, loss) into {tmp_path / 'mb'} (--scale 1: 10-15 min "
        "on one CPU thread)",
        "microbench: sweep 1/2 gemm: 3 records in T s",
        "microbench: sweep 2/2 loss: 0 records in T s",
    ]


def test_report_says_each_configuration_as_it_starts(tmp_path, monkeypatch, capsys):
    from perfmodel import model, report

    monkeypatch.setattr(model, "load_model", lambda path=None: None)
    meta = {"unprofiled_step_cpu_us": 1000.0, "machine_slowdown": 1.0}
    monkeypatch.setattr(report, "measure", lambda cfg, steps: {"meta": meta})
    monkeypatch.setattr(report.tr, "write_trace", lambda doc, path: None)
    monkeypatch.setattr(report, "score", lambda *args: {})
    report.run(tmp_path, steps=1, quick=True, passes=2)
    names = [name for name, _ in report.heldout_configs(True)]
    err = [re.sub(r"\(\d+ s so far\)", "(T)", x) for x in capsys.readouterr().err.splitlines()]
    assert err == [f"report: pass {p}/2, configuration {i}/{len(names)} {name} (T)"
                   for p in (1, 2) for i, name in enumerate(names, 1)]  # fmt: skip

"""`report`: predicted vs measured per-batch time on held-out configurations.

For each configuration (none of them used in fitting: other MLP shapes and batch sizes than the
fit traces of `fit_traces.FIT_CONFIGS`), the model predicts the step from its captured graph
alone, then the configuration trains for a few steps: plain steps are timed (median thread-CPU
and wall time; with FAE the mean over whole scheduling windows, since hot and cold batches
differ) and six more are profiled, whose kernels (each the median over those steps) give the
kernel models' held-out errors.

Every measurement runs on a steady machine: a canary before and after it is compared with the
hardware description's (`hardware.on_steady_machine`), and a run during which the machine was
more than 15% slower than described is repeated after a pause (the canary is checked at most
eight times; each row reports its `machine_slowdown`).

With ``passes`` > 1 every configuration is measured that many times, in rounds over all of them
(minutes apart); the measured step and each kernel are the median over the passes.
``repeatability`` holds the geomean difference between the first two passes, end to end and per
operator type, over all configurations and over those whose two passes both had a steady canary:
the measurement's own noise floor on this machine, against which the model's errors can be read.

`rescore` scores the traces of an earlier report with another model without measuring again.

The end-to-end error is against thread-CPU time on CPU (``measured_us``): on a machine shared
with other processes wall time also counts the time the core was given to someone else
(``e2e_gmae_wall`` is reported too, with the load average before and after). On CUDA it is
against wall time: the host waits for the device, and that wait is the step.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from perfmodel import interactions
from perfmodel import trace as tr
from perfmodel.errors import TraceError
from perfmodel.features import op_type
from perfmodel.fit_traces import base_config, measure_steps
from perfmodel.graph import (
    batches_for,
    build_trainer,
    corrected_us,
    is_fae,
    records_from_trace,
)
from perfmodel.hardware import SLOW_LIMIT
from perfmodel.kernel_models import gmae
from perfmodel.profiling import trace_meta

log = logging.getLogger(__name__)

MLPS = {
    "small": {"arch_mlp_bot": (13, 64, 16), "arch_mlp_top": (128, 1)},
    "kaggle": {"arch_mlp_bot": (13, 512, 256, 64, 16), "arch_mlp_top": (512, 256, 1)},
    "wide": {"arch_mlp_bot": (13, 1024, 16), "arch_mlp_top": (1024, 512, 1)},
    # 64-wide embeddings: a DCN input of 27 x 64 = 1728, past the MLP GEMMs' widths
    "d64": {"arch_mlp_bot": (13, 256, 64), "arch_mlp_top": (512, 256, 1),
            "arch_sparse_feature_size": 64},
}  # fmt: skip


def heldout_configs(quick: bool = False) -> list[tuple[str, dict]]:
    """Three MLP shapes x batch 128..4096 x fp32/bf16 with the fused collection, plus FAE, plus
    DCN at two of the dot configurations."""
    out = []
    batches = {"small": (128, 1024, 4096), "kaggle": (256, 2048), "wide": (512, 4096)}
    for mlp, bs in batches.items():
        for b in bs:
            for prec in ("fp32", "bf16"):
                out.append(
                    (f"{mlp}-b{b}-{prec}", {**MLPS[mlp], "mini_batch_size": b, "precision": prec})
                )
    fae = {"placement": "fae", "hot_budget": "2MB", "fae_switch_period": 8}
    for mlp, b, prec in (("small", 512, "fp32"), ("kaggle", 1024, "bf16"), ("small", 4096, "bf16")):
        out.append(
            (
                f"{mlp}-b{b}-{prec}-fae",
                {**MLPS[mlp], "mini_batch_size": b, "precision": prec, **fae},
            )
        )
    # DCN next to the same dot configuration: its error read against the dot step's (issue 38)
    dcn = {"arch_interaction_op": "dcn", "dcn_num_layers": 3, "dcn_low_rank_dim": 128}
    for mlp, b in (("small", 1024), ("kaggle", 2048)):
        for prec in ("fp32", "bf16"):
            out.append(
                (
                    f"{mlp}-b{b}-{prec}-dcn",
                    {**MLPS[mlp], "mini_batch_size": b, "precision": prec, **dcn},
                )
            )
    if quick:
        keep = {"small-b128-fp32", "small-b1024-bf16", "kaggle-b256-fp32", "small-b512-fp32-fae",
                "small-b1024-bf16-dcn"}  # fmt: skip
        out = [c for c in out if c[0] in keep]
    return out


# `report --dcn`: dot configurations and their DCN partners (cross layers, rank), the partner
# differing in the interaction only (`interactions.dot_partner`)
DCN_VARIANTS = {
    ("small", 1024, "fp32"): ((3, 128), (1, 32)),
    ("small", 1024, "bf16"): ((3, 128),),
    ("kaggle", 2048, "fp32"): ((3, 128), (2, 256)),
    ("kaggle", 2048, "bf16"): ((3, 128), (2, 256)),
    ("d64", 512, "fp32"): ((2, 256),),
    ("d64", 512, "bf16"): ((2, 256),),
}


def dcn_configs(quick: bool = False) -> list[tuple[str, dict]]:
    """The matched dot/DCN set: each dot configuration followed by its DCN variants (named
    ``-dcn`` at 3 layers of rank 128, as in `heldout_configs`, else ``-dcn<layers>r<rank>``);
    `quick`: the first dot configuration and its variants only."""
    out = []
    for (mlp, b, prec), variants in list(DCN_VARIANTS.items())[: 1 if quick else None]:
        dot_name, dot = f"{mlp}-b{b}-{prec}", {**MLPS[mlp], "mini_batch_size": b, "precision": prec}
        out.append((dot_name, dot))
        for layers, rank in variants:
            suffix = "dcn" if (layers, rank) == (3, 128) else f"dcn{layers}r{rank}"
            dcn = {"arch_interaction_op": "dcn", "dcn_num_layers": layers, "dcn_low_rank_dim": rank}
            out.append((f"{dot_name}-{suffix}", {**dot, **dcn}))
    return out


def all_configs() -> list[tuple[str, dict]]:
    """Every configuration a report may have measured (`rescore` looks for each one's traces)."""
    seen: dict[str, dict] = {}
    for name, c in heldout_configs() + dcn_configs():
        seen.setdefault(name, c)
    return list(seen.items())


def measure(cfg, steps: int, profiled: int = 6) -> dict:
    """Time `steps` plain steps (after warm-up) and profile `profiled` more: a trace document
    whose meta holds the timed step (``unprofiled_step_us``/``unprofiled_step_cpu_us``), the
    number of timed steps and the machine's slowdown."""
    threads = torch.get_num_threads()
    trainer = build_trainer(cfg)
    fae = is_fae(trainer)
    warm = 3
    if fae:  # whole scheduling windows, in the scheduler's order
        period = cfg.fae.switch_period
        n = warm + max(steps, 2 * period) + profiled
        it = trainer.data.train.batches(0)
        bs = [next(it).to(trainer.device) for _ in range(n)]
        timed = bs[warm : n - profiled]
        timed = timed[: len(timed) // period * period] or timed
    else:
        bs = batches_for(trainer, cfg.training.mini_batch_size, warm + steps + profiled)
        timed = bs[warm : warm + steps]
    torch.set_num_threads(threads)
    agg = statistics.mean if fae else statistics.median
    wall, cpu, graphs, slow = measure_steps(trainer, bs[:warm], timed, bs[-profiled:], agg)
    meta = trace_meta(trainer, cfg.training.mini_batch_size)
    meta["unprofiled_step_us"], meta["unprofiled_step_cpu_us"] = wall, cpu
    meta["timed_steps"] = len(timed)
    meta["machine_slowdown"] = slow
    return tr.make_doc(meta, graphs)


def kernel_key(rec: dict, seen: dict) -> tuple:
    """A kernel's identity across two measurements of the same configuration: operator, shapes,
    the op it runs in, and its occurrence among kernels alike."""
    k = (rec["name"], json.dumps(rec.get("shapes")), rec.get("op", ""))
    seen[k] = seen.get(k, 0) + 1
    return (*k, seen[k])


def combine_passes(per_pass: list[list[dict]]) -> tuple[list[dict], dict[tuple, list[float]]]:
    """Kernel records of several measurements of one configuration -> the first pass's records
    with each duration the median over the passes that have that kernel, and the per-pass
    durations by kernel key (for the repeatability)."""
    times: dict[tuple, list[float]] = {}
    keyed = []
    for recs in per_pass:
        seen: dict = {}
        keyed.append([(kernel_key(r, seen), r) for r in recs])
        for key, r in keyed[-1]:
            times.setdefault(key, []).append(corrected_us(r))
    out = []
    for key, r in keyed[0]:
        rec = dict(r, dur_us=statistics.median(times[key]), n_events=1)
        out.append(rec)
    return out, times


def _slowdown(meta: dict) -> float:
    return float(meta.get("machine_slowdown") or 1.0)


def _on_cuda(meta: dict) -> bool:
    return str(meta.get("device", "cpu")).startswith("cuda")


def _kinds(doc: dict) -> int:
    return max(len({json.dumps([o["name"] for o in st["ops"]]) for st in doc["steps"]}), 1)


def run(
    out_dir: str | Path,
    model_path: str | Path | None = None,
    steps: int = 11,
    quick: bool = False,
    passes: int = 1,
    dcn: bool = False,
) -> dict:
    """Measure every held-out configuration (with `dcn`, the matched dot/DCN set of
    `dcn_configs` instead) `passes` times (rounds over all of them), writing each
    measurement's trace, then `score` them."""
    from perfmodel.model import load_model

    if passes < 1:
        raise ValueError(f"passes must be >= 1, got {passes}")
    model = load_model(model_path)
    out_dir = Path(out_dir)
    (out_dir / "traces").mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    configs = dcn_configs(quick) if dcn else heldout_configs(quick)
    docs: dict[str, list[dict]] = {name: [] for name, _ in configs}
    t0 = time.perf_counter()
    for p in range(passes):  # rounds over all configurations: the passes are minutes apart
        for i, (name, changes) in enumerate(configs, 1):
            print(f"report: pass {p + 1}/{passes}, configuration {i}/{len(configs)} {name} "
                  f"({time.perf_counter() - t0:.0f} s so far)", file=sys.stderr, flush=True)  # fmt: skip
            doc = measure(base_config(**changes), steps)
            suffix = f".pass{p}" if passes > 1 else ""
            tr.write_trace(doc, out_dir / "traces" / f"{name}{suffix}.trace.json")
            docs[name].append(doc)
            log.info("%s pass %d: %.2f ms (cpu), slowdown %.2f", name, p,
                     doc["meta"]["unprofiled_step_cpu_us"] / 1e3, doc["meta"]["machine_slowdown"])  # fmt: skip
    return score(model, configs, docs, out_dir, load_before)


def rescore(report_dir: str | Path, model_path: str | Path | None = None) -> dict:
    """Score the traces an earlier `report` wrote (``traces/<config>[.pass<p>].trace.json``)
    with a model, measuring nothing: a refitted model against the same measurements."""
    from perfmodel.model import load_model

    report_dir = Path(report_dir)
    docs: dict[str, list[dict]] = {}
    configs = []
    for name, changes in all_configs():
        paths = trace_paths(report_dir / "traces", name)
        if paths:
            configs.append((name, changes))
            docs[name] = [tr.read_trace(p) for p in paths]
    if not configs:
        raise TraceError(f"{report_dir / 'traces'}: no held-out configuration traces")
    return score(load_model(model_path), configs, docs, report_dir, None)


def trace_paths(traces: Path, name: str) -> list[Path]:
    """A configuration's traces in a report: ``<name>.pass<p>.trace.json`` in pass order, or the
    single ``<name>.trace.json`` of a one-pass report."""
    passes = {}
    for path in traces.glob(f"{name}.pass*.trace.json"):
        number = path.name[len(name) + len(".pass") : -len(".trace.json")]
        if number.isdigit():
            passes[int(number)] = path
    single = traces / f"{name}.trace.json"
    return [passes[p] for p in sorted(passes)] or ([single] if single.exists() else [])


def score(
    model, configs, docs: dict[str, list[dict]], out_dir: Path, load_before: float | None
) -> dict:
    """Predicted vs measured per configuration (medians over the passes, as every measurement
    here is a median), kernel errors per operator type, and with two or more passes the
    repeatability between the first two."""
    rows = []
    kernels = []  # (config, record, predicted, measured) for the per-interaction comparison
    kernel_pairs: dict[str, tuple[list[float], list[float]]] = {}
    repeat: dict[str, dict[str, tuple[list[float], list[float]]]] = {"all": {}, "steady": {}}
    repeat_e2e: dict[str, tuple[list[float], list[float]]] = {"all": ([], []), "steady": ([], [])}
    for name, changes in configs:
        cfg = base_config(**changes)
        t0 = time.perf_counter()
        pred = model.predict(cfg)
        t_pred = time.perf_counter() - t0
        all_docs = docs[name]
        per_pass = [records_from_trace(d) for d in all_docs]
        recs, _ = combine_passes(per_pass)
        measured_active = sum(r["dur_us"] for r in recs) / _kinds(all_docs[0])
        for rec in recs:
            pk, mk = kernel_pairs.setdefault(op_type(rec["name"]), ([], []))
            pk.append(model.kernels.predict(rec))
            mk.append(rec["dur_us"])
            kernels.append((name, rec, pk[-1], mk[-1]))
        metas = [d["meta"] for d in all_docs]
        if len(all_docs) >= 2:
            _, times = combine_passes(per_pass[:2])
            both_steady = all(_slowdown(m) <= SLOW_LIMIT for m in metas[:2])
            for which in ("all", "steady") if both_steady else ("all",):
                for key, ts in times.items():
                    if len(ts) == 2:
                        a, b = repeat[which].setdefault(op_type(key[0]), ([], []))
                        a.append(ts[1])
                        b.append(ts[0])
                field = "unprofiled_step_us" if _on_cuda(metas[0]) else "unprofiled_step_cpu_us"
                repeat_e2e[which][0].append(metas[1][field])
                repeat_e2e[which][1].append(metas[0][field])
        cpu = statistics.median(m["unprofiled_step_cpu_us"] for m in metas)
        wall = statistics.median(m["unprofiled_step_us"] for m in metas)
        # on CUDA the step's time is the wall clock's (the host waits for the device); on CPU the
        # training thread's CPU time (other processes' time slices excluded)
        measured = wall if _on_cuda(metas[0]) else cpu
        row = {
            "config": name, "batch_size": cfg.training.mini_batch_size, "precision": cfg.training.precision,
            "mlp_bot": "-".join(map(str, cfg.arch.mlp_bot)), "mlp_top": "-".join(map(str, cfg.arch.mlp_top)),
            "placement": cfg.placing.placement, "interaction": cfg.arch.interaction_op,
            "dcn_num_layers": cfg.arch.dcn_num_layers if cfg.arch.interaction_op == "dcn" else None,
            "dcn_low_rank_dim": cfg.arch.dcn_low_rank_dim if cfg.arch.interaction_op == "dcn" else None,
            "predicted_us": pred["per_batch_us"], "measured_us": measured,
            "measured_cpu_us": cpu,
            "measured_wall_us": wall, "timed_steps": metas[0].get("timed_steps"),
            "machine_slowdown": round(max(_slowdown(m) for m in metas), 3),
            "error": pred["per_batch_us"] / measured - 1.0,
            "error_wall": pred["per_batch_us"] / wall - 1.0,
            "predicted_device_active_us": pred["device_active_total_us"],
            "measured_device_active_us": measured_active, "predict_s": t_pred,
            "hot_share": pred.get("hot_share"),
        }  # fmt: skip
        if len(all_docs) > 1:
            row["passes_cpu_us"] = [m["unprofiled_step_cpu_us"] for m in metas]
            row["passes_machine_slowdown"] = [round(_slowdown(m), 3) for m in metas]
        rows.append(row)
        log.info("%s: predicted %.2f ms, measured %.2f ms (cpu) %.2f ms (wall): %+.1f%%", name,
                 row["predicted_us"] / 1e3, row["measured_cpu_us"] / 1e3, row["measured_wall_us"] / 1e3,
                 100 * row["error"])  # fmt: skip
    result = {
        "e2e_gmae": gmae([r["predicted_us"] for r in rows], [r["measured_us"] for r in rows]),
        "e2e_gmae_wall": gmae(
            [r["predicted_us"] for r in rows], [r["measured_wall_us"] for r in rows]
        ),
        "device_active_gmae": gmae(
            [r["predicted_device_active_us"] for r in rows],
            [r["measured_device_active_us"] for r in rows],
        ),  # fmt: skip
        "kernel_gmae": {t: gmae(p, m) for t, (p, m) in sorted(kernel_pairs.items())},
        "kernel_counts": {t: len(p) for t, (p, _) in sorted(kernel_pairs.items())},
        "n_heldout": len(rows),
        "passes": max(len(v) for v in docs.values()),
        "load_avg_1m": (
            {"before": load_before, "after": os.getloadavg()[0]} if load_before is not None else None
        ),  # None: rescored from traces
        "threads": torch.get_num_threads(),
        "hardware": model.hardware.get("key"),
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "fit_heldout_shapes_gmae": model.fit_info.get("heldout_gmae"),
        "interactions": interactions.summary(configs, rows, kernels),
        "configs": rows,
    }  # fmt: skip
    if repeat_e2e["all"][0]:
        result["repeatability"] = {
            which: {
                "configs": len(repeat_e2e[which][0]),
                "e2e_gmae": gmae(*repeat_e2e[which]) if repeat_e2e[which][0] else None,
                "kernel_gmae": {t: gmae(a, b) for t, (a, b) in sorted(repeat[which].items())},
            }
            for which in ("all", "steady")
        }  # fmt: skip
    (out_dir / "report.json").write_text(json.dumps(result, indent=2) + "\n")
    try:
        plot(result, out_dir / "report.png")
        result["plot"] = str(out_dir / "report.png")
    except Exception as e:  # noqa: BLE001 - a missing plotting backend must not lose the numbers
        log.warning("no plot: %s", e)
    return result


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["configs"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5))
    meas = [r["measured_us"] / 1e3 for r in rows]
    pred = [r["predicted_us"] / 1e3 for r in rows]
    for r, m, p in zip(rows, meas, pred):
        a.scatter(m, p, marker="^" if r["placement"] == "fae" else "o",
                  color="tab:blue" if r["precision"] == "fp32" else "tab:orange")  # fmt: skip
    lo, hi = min(meas + pred) * 0.8, max(meas + pred) * 1.25
    a.plot([lo, hi], [lo, hi], "k--", lw=1)
    a.fill_between(
        [lo, hi], [lo * 0.92, hi * 0.92], [lo * 1.08, hi * 1.08], color="grey", alpha=0.2
    )
    a.set_xscale("log")
    a.set_yscale("log")
    a.set_xlabel("measured per-batch time, ms (thread CPU)")
    a.set_ylabel("predicted, ms")
    a.set_title(
        f"held-out configs: e2e GMAE {100 * result['e2e_gmae']:.1f}% (blue fp32, orange bf16, ^ FAE)"
    )
    names = [r["config"] for r in rows]
    b.barh(range(len(rows)), [100 * r["error"] for r in rows], color="tab:green")
    b.set_yticks(range(len(rows)), names, fontsize=7)
    b.axvline(0, color="k", lw=1)
    b.set_xlabel("prediction error, %")
    la = result["load_avg_1m"]
    b.set_title(
        f"load avg {la['before']:.1f} -> {la['after']:.1f}" if la else "rescored from traces"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def format_table(result: dict) -> str:
    lines = [
        f"{'config':28s} {'predicted ms':>12s} {'measured ms':>12s} {'wall ms':>9s} {'error':>7s}"
    ]
    for r in result["configs"]:
        lines.append(f"{r['config']:28s} {r['predicted_us'] / 1e3:12.2f} {r['measured_us'] / 1e3:12.2f} "
                     f"{r['measured_wall_us'] / 1e3:9.2f} {100 * r['error']:+6.1f}%")  # fmt: skip
    lines.append(f"e2e GMAE {100 * result['e2e_gmae']:.2f}% over {result['n_heldout']} held-out configs "
                 f"(wall {100 * result['e2e_gmae_wall']:.2f}%); device active GMAE "
                 f"{100 * result['device_active_gmae']:.2f}%")  # fmt: skip
    lines.append("kernel GMAE: " + ", ".join(f"{t} {100 * e:.1f}% (n={result['kernel_counts'][t]})"
                                             for t, e in result["kernel_gmae"].items()))  # fmt: skip
    lines += interactions.format_lines(result.get("interactions"))
    for which, rep in (result.get("repeatability") or {}).items():
        if rep["configs"]:
            lines.append(f"repeatability pass 1 vs 2 ({which}, {rep['configs']} configs): e2e "
                         f"{100 * rep['e2e_gmae']:.1f}%, kernels " + ", ".join(
                             f"{t} {100 * e:.1f}%" for t, e in rep["kernel_gmae"].items()))  # fmt: skip
    la = result["load_avg_1m"]
    if la:
        lines.append(
            f"load average {la['before']:.2f} -> {la['after']:.2f}, {result['threads']} thread(s)"
        )
    return "\n".join(lines)

"""The summary a run prints at its end, from summary.json's contents: the metrics, the
steady-state throughput with the time spent beside it, and what the framework decided and did:
one line per capability the run used (a part of summary.json that is there), nothing about the
others.

    test AUC 0.7312  logloss 0.4721  accuracy 0.7801  NE 0.8710
    trained 2,097,152 samples in 1,024 steps, 63.0 s: 35,012 samples/s in the steady state (fp32, cpu)
    time: compile 0.0 s, data 4.1 s, evaluation 3.2 s, checkpoints 0.4 s
    placement: fae (picked by --placement auto), 120,000 hot rows, 212 embedding bytes moved per sample
    slipstream: 23.4% of inputs skipped (480,000), 31.0% of tracked rows stale
    SSD tier: row cache hit rate 93.1%, 1,204,321 rows read
    run directory: runs/a
"""

from __future__ import annotations


def _num(x) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def _share(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _training(s: dict) -> list[str]:
    tp, t = s.get("throughput", {}), s.get("time", {})
    steady = tp.get("steady_samples_per_s") is not None
    how = "in the steady state" if steady else "over the whole run (too short for a steady state)"
    lines = [
        f"trained {s['samples']:,} samples in {s['steps']:,} steps, {s['wall_s']:.1f} s: "
        f"{s['train_samples_per_s']:,.0f} samples/s {how} ({s['precision']}, {s['device']})"
    ]
    beside = []
    if s.get("compiled"):
        beside.append(f"compile {t.get('compile_s', 0.0):.1f} s")
    for key, name in (("data_s", "data"), ("eval_s", "evaluation"),
                      ("checkpoint_s", "checkpoints")):  # fmt: skip
        if key in t:
            beside.append(f"{name} {t[key]:.1f} s")
            if key == "data_s" and steady:
                beside[-1] += f" ({tp.get('steady_data_s', 0.0):.1f} s of it in the steady state)"
    if beside:
        lines.append("time: " + ", ".join(beside))
    return lines


def _placement(p: dict) -> str:
    text = f"placement: {p.get('kind', '?')}"
    if p.get("requested") == "auto":
        text += " (picked by --placement auto)"
    if p.get("hot_rows") is not None:
        text += f", {p['hot_rows']:,} hot rows"
    moved = p.get("emb_bytes_per_sample")
    if moved:  # a placement that moves rows between tiers
        text += f", {moved:,.0f} embedding bytes moved per sample"
    if p.get("plan_source"):
        text += f"; plan {p['plan_source']}"
    return text


def _slipstream(sl: dict) -> str:
    if sl.get("shorter_than_warmup"):
        return (
            f"slipstream: nothing skipped: the run ({sl['steps']} steps) was shorter than the "
            f"warm-up (--slipstream-warmup {sl['warmup_steps']})"
        )
    return (
        f"slipstream: {_share(sl.get('skipped_input_share'))} of inputs skipped "
        f"({sl.get('samples_skipped', 0):,}), {_share(sl.get('stale_row_share'))} of tracked rows "
        "stale"
    )


def _ssd_tier(d: dict) -> str:
    amp = d.get("read_amplification")
    return (
        f"SSD tier: row cache hit rate {_share(d.get('cache_hit_rate'))}, "
        f"{d.get('rows_read', 0):,} rows read in {d.get('blocks_read', 0):,} blocks "
        f"(read amplification {'-' if amp is None else amp}), {d.get('layout', 'identity')} layout"
    )


def _inference(d: dict) -> str:
    if d.get("quantized"):
        return (
            f"inference: quantized (embeddings {d['emb_bits']}-bit, MLPs {d['mlp_bits']}-bit; "
            "hybrid_dlrm.serving.quantize writes such a model for serving)"
        )
    return "inference: not quantized (fp32 weights)"


# summary.json's capability parts that have a line, in the order they print
PARTS = (("slipstream", _slipstream), ("ssd_tier", _ssd_tier), ("inference", _inference))


def summary_lines(s: dict, run_dir: str) -> list[str]:
    lines = [
        f"test AUC {_num(s.get('test_auc'))}  logloss {_num(s.get('test_logloss'))}  "
        f"accuracy {_num(s.get('test_accuracy'))}  NE {_num(s.get('test_ne'))}"
    ]
    if s.get("steps"):
        lines += _training(s)
    if "placement" in s:
        lines.append(_placement(s["placement"]))
    lines += [describe(s[name]) for name, describe in PARTS if name in s]
    lines.append(f"run directory: {run_dir}")
    return lines

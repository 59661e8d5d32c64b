"""The report's comparison of interactions: how well the model predicts a DCN step against how
well it predicts the same step with the dot interaction (issue 38).

A DCN configuration is matched with the dot configuration that has every other setting (batch,
tables, MLPs, precision, placement) the same. Per interaction: the median and the worst
|predicted - measured| / measured over the configurations (dot: those matched with a DCN one),
their kernel errors per operator type, and the errors of the cross layers' own GEMMs (`is_cross
_gemm`) by precision and direction, next to the MLP GEMMs of the same steps.
"""

from __future__ import annotations

import statistics

from perfmodel.features import gemm_dims, is_cross_gemm, op_type
from perfmodel.kernel_models import gmae

# the settings a DCN configuration adds to its dot partner's
DCN_KEYS = ("arch_interaction_op", "dcn_num_layers", "dcn_low_rank_dim")


def interaction_of(changes: dict) -> str:
    return changes.get("arch_interaction_op", "dot")


def dot_partner(changes: dict) -> dict:
    """The settings of the dot configuration a DCN configuration is compared with."""
    return {k: v for k, v in changes.items() if k not in DCN_KEYS}


def abs_errors(pred: list[float], meas: list[float], names: list[str] | None = None) -> dict:
    """n, geomean, median and worst of |pred/meas - 1| (and which one is the worst)."""
    errs = [abs(p / m - 1.0) for p, m in zip(pred, meas) if m > 0]
    if not errs:
        return {"n": 0}
    worst = max(range(len(errs)), key=errs.__getitem__)
    out = {"n": len(errs), "gmae": gmae(pred, meas), "median_abs": statistics.median(errs),
           "worst_abs": errs[worst]}  # fmt: skip
    if names:
        out["worst"] = names[worst]
    return out


def _key(changes: dict) -> str:
    return repr(sorted(changes.items()))


def summary(configs: list[tuple[str, dict]], rows: list[dict], kernels: list[tuple]) -> dict | None:
    """The per-interaction comparison of a report. `rows` are the report's rows (``config``,
    ``predicted_us``, ``measured_us``) in the order of `configs`; `kernels` holds (config name,
    kernel record, predicted us, measured us) of every measured kernel. None without a DCN
    configuration matched with a dot one."""
    by_settings = {_key(c): name for name, c in configs if interaction_of(c) == "dot"}
    row_of = {r["config"]: r for r in rows}
    pairs = []
    for name, c in configs:
        partner = by_settings.get(_key(dot_partner(c))) if interaction_of(c) == "dcn" else None
        if partner in row_of and name in row_of:
            pairs.append({"dcn": name, "dot": partner, "dcn_num_layers": c.get("dcn_num_layers"),
                          "dcn_low_rank_dim": c.get("dcn_low_rank_dim"),
                          "dcn_error": row_of[name]["error"], "dot_error": row_of[partner]["error"]})  # fmt: skip
    if not pairs:
        return None
    members = {"dot": sorted({p["dot"] for p in pairs}), "dcn": [p["dcn"] for p in pairs]}
    out: dict = {"pairs": pairs}
    for inter, names in members.items():
        rs = [row_of[n] for n in names]
        out[inter] = abs_errors([r["predicted_us"] for r in rs], [r["measured_us"] for r in rs],
                                names)  # fmt: skip
        by_type: dict[str, tuple[list, list]] = {}
        for name, rec, p, m in kernels:
            if name in names:
                pk, mk = by_type.setdefault(op_type(rec["name"]), ([], []))
                pk.append(p)
                mk.append(m)
        passes = [r["passes_cpu_us"] for r in rs if len(r.get("passes_cpu_us") or []) >= 2]
        if passes:  # the measurement's own noise on these configurations: pass 2 against pass 1
            out[inter]["repeatability_gmae"] = gmae([p[1] for p in passes], [p[0] for p in passes])
        out[inter]["kernel_gmae"] = {t: gmae(p, m) for t, (p, m) in sorted(by_type.items())}
    out["cross_layer_gemms"] = _gemm_groups(
        [(name, rec, p, m) for name, rec, p, m in kernels if name in members["dcn"] and is_cross_gemm(rec)]
    )  # fmt: skip
    out["mlp_gemms_of_dcn_steps"] = _gemm_groups(
        [(name, rec, p, m) for name, rec, p, m in kernels
         if name in members["dcn"] and op_type(rec["name"]) == "gemm" and not is_cross_gemm(rec)]
    )  # fmt: skip
    return out


def _gemm_groups(items: list[tuple]) -> dict:
    """Errors of GEMM kernels, all together and by precision and direction (forward: in
    `aten::linear`; backward: in an autograd node)."""
    groups: dict[str, list[tuple]] = {"all": items}
    for it in items:
        d = gemm_dims(it[1]) or {"bf16": 0}
        way = "backward" if "Backward" in str(it[1].get("op", "")) else "forward"
        groups.setdefault(f"{'bf16' if d['bf16'] else 'fp32'} {way}", []).append(it)
    return {
        g: abs_errors(
            [p for _, _, p, _ in its],
            [m for _, _, _, m in its],
            [f"{n}: {r['name']} {r.get('shapes')}" for n, r, _, _ in its],
        )  # fmt: skip
        for g, its in groups.items()
    }


def format_lines(inter: dict | None) -> list[str]:
    if not inter:
        return []
    lines = []
    for name in ("dot", "dcn"):
        s = inter[name]
        lines.append(f"{name}: {s['n']} configs, |error| median {100 * s['median_abs']:.1f}%, worst "
                     f"{100 * s['worst_abs']:.1f}% ({s['worst']}), geomean {100 * s['gmae']:.1f}%"
                     + (f" (passes repeat to {100 * s['repeatability_gmae']:.1f}%)"
                        if "repeatability_gmae" in s else "") + "; "
                     "kernels " + ", ".join(f"{t} {100 * e:.1f}%" for t, e in s["kernel_gmae"].items()))  # fmt: skip
    for title, key in (("cross-layer GEMMs", "cross_layer_gemms"),
                       ("MLP GEMMs of the DCN steps", "mlp_gemms_of_dcn_steps")):  # fmt: skip
        parts = [f"{g} n={s['n']} median {100 * s['median_abs']:.1f}% worst {100 * s['worst_abs']:.1f}%"
                 for g, s in inter[key].items() if s.get("n")]  # fmt: skip
        lines.append(f"{title}: " + "; ".join(parts))
    return lines

"""Case 5: how the cost of `compress --recipe int8` (PTQ) grows with model size.

Three Keras conv nets of the same family (~0.1M, 1M, 10M parameters, digits input,
untrained: PTQ cost does not depend on the weights' values), each compressed by the toolkit
(both formats, validated) and by the baseline script (int8 .tflite, evaluated), A B.
Growth is the log-log slope of wall time and peak RSS against parameter count: 1.0 is
linear; below 1 means fixed costs (imports, conversion set-up) still dominate.
"""
from __future__ import annotations

import math
from itertools import pairwise

from bench.case import Case, RunContext, case_results, not_measured, target
from bench.markdown import fmt, table
from bench.measure import ratio
from bench.sides import ARTIFACTS, run_baseline, run_toolkit

NETS = ("scale_0.1m", "scale_1m", "scale_10m")


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of log(y) on log(x)."""
    pairs = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x and y]
    if len(pairs) < 2:
        return None
    mx = sum(p[0] for p in pairs) / len(pairs)
    my = sum(p[1] for p in pairs) / len(pairs)
    den = sum((p[0] - mx) ** 2 for p in pairs)
    return round(sum((p[0] - mx) * (p[1] - my) for p in pairs) / den, 3) if den else None


def run(models: dict, log, nets=NETS) -> dict:
    rows, errors = [], []
    for net in nets:
        entry = models.get("keras", {}).get(net)
        if entry is None:
            errors.append(f"{net}: model was not prepared")
            continue
        where = ARTIFACTS / "scaling" / net
        log(f"scaling {net}: toolkit int8")
        tk = run_toolkit("keras", entry, "int8", "digits", where / "toolkit")
        log(f"scaling {net}: baseline int8")
        base = run_baseline("keras", entry, ["int8"], "digits", where / "baseline", evaluate=True)
        for run_ in (tk, base):
            if run_.error:
                errors.append(f"{net} {run_.side}: {run_.error}")
        rows.append({
            "net": net, "params": entry.get("params"),
            "toolkit_ok": tk.error is None, "baseline_ok": base.error is None,
            "toolkit_wall_s": _ok(tk, round(tk.process.wall_s, 3)),
            "toolkit_cpu_s": _ok(tk, round(tk.process.cpu_s, 3)),
            "toolkit_peak_rss_mb": _ok(tk, round(tk.process.peak_rss_mb, 1)),
            "baseline_wall_s": _ok(base, round(base.process.wall_s, 3)),
            "baseline_cpu_s": _ok(base, round(base.process.cpu_s, 3)),
            "baseline_peak_rss_mb": _ok(base, round(base.process.peak_rss_mb, 1)),
            "wall_ratio": _ok(tk, _ok(base, ratio(tk.process.wall_s, base.process.wall_s, 3))),
            "toolkit_timings_s": (tk.report or {}).get("timings_s"),
            "toolkit": tk.summary(), "baseline": base.summary(),
        })
    return {"rows": rows, "growth": growth_of(rows), "errors": errors}


def growth_of(rows: list[dict]) -> dict:
    """Log-log slopes of cost vs parameters: whole cost, and cost above the smallest net."""
    ok = [r for r in rows if r["toolkit_ok"]]
    base_ok = [r for r in rows if r["baseline_ok"]]
    params = [r["params"] for r in ok]
    return {
        "toolkit_wall_slope": slope(params, [r["toolkit_wall_s"] for r in ok]),
        "toolkit_cpu_slope": slope(params, [r.get("toolkit_cpu_s") for r in ok]),
        "toolkit_rss_slope": slope(params, [r["toolkit_peak_rss_mb"] for r in ok]),
        "baseline_wall_slope": slope([r["params"] for r in base_ok],
                                     [r["baseline_wall_s"] for r in base_ok]),
        "toolkit_marginal_wall_slope": marginal_slope(ok, "toolkit_wall_s"),
        "toolkit_marginal_cpu_slope": marginal_slope(ok, "toolkit_cpu_s"),
        "toolkit_marginal_rss_slope": marginal_slope(ok, "toolkit_peak_rss_mb"),
        "baseline_marginal_wall_slope": marginal_slope(base_ok, "baseline_wall_s"),
        "baseline_marginal_rss_slope": marginal_slope(base_ok, "baseline_peak_rss_mb"),
    }


def _ok(run_, value):
    """A failed run's time and memory measure the failure, not the work: left out."""
    return value if run_.error is None else None


def marginal_slope(rows: list[dict], key: str) -> float | None:
    """Slope of the cost *above the smallest net's* against the parameters added: the growth
    once fixed start-up costs are taken out (None when there are fewer than three nets)."""
    if len(rows) < 3:
        return None
    first = rows[0]
    if any(r.get(key) is None for r in rows):
        return None
    extra = [(r["params"] - first["params"], r[key] - first[key]) for r in rows[1:]]
    if any(dx <= 0 or dy <= 0 for dx, dy in extra):
        return None
    return slope([dx for dx, _ in extra], [dy for _, dy in extra])


def derive(scaling: dict) -> None:
    """Growth from the rows again: a changed slope formula reaches committed results on --render."""
    if "rows" in scaling:
        scaling["growth"] = growth_of(scaling["rows"])


def targets(results: dict) -> dict:
    """Log-log slope of the whole cost (wall time, peak RSS) against parameter count over the
    three nets; 1.0 = linear, the value is the worse of the two. The note adds the slope of the
    cost *above the smallest net's*: what the size-dependent part does (for wall time that rests
    on a sub-second difference at 1M, so it moves with noise; RSS is steady from run to run)."""
    scaling = case_results(results, "scaling")
    growth = scaling.get("growth", {})
    whole = {"wall": growth.get("toolkit_wall_slope"), "peak RSS": growth.get("toolkit_rss_slope")}
    known = [v for v in whole.values() if v is not None]
    value = max(known) if known else None
    note = ("whole-cost slopes: " + ", ".join(f"{k} {v}" for k, v in whole.items())
            + "; cost above the 0.1M net vs parameters added: wall "
            f"{growth.get('toolkit_marginal_wall_slope')}, peak RSS "
            f"{growth.get('toolkit_marginal_rss_slope')} (hand-written baseline: wall "
            f"{growth.get('baseline_marginal_wall_slope')}, peak RSS "
            f"{growth.get('baseline_marginal_rss_slope')})")
    missing = len([r for r in scaling.get("rows", []) if r.get("toolkit_ok")]) < 3
    return {"scaling_growth": target(value, 1.0, "<=", "growth of compress --recipe int8 cost "
                                     "(wall, peak RSS) with parameter count, log-log slope "
                                     "(1.0 = linear)", note, force_miss=missing or len(known) < 2)}


def why_missed(name: str, target: dict, results: dict) -> str:
    """What each step up in parameters adds, both sides, and the whole-cost ratios."""
    scaling = case_results(results, "scaling")
    if target["value"] is None:
        return not_measured(results, "scaling")
    rows = [r for r in scaling.get("rows", []) if r.get("toolkit_ok")]
    parts = []
    for side in ("toolkit", "baseline"):
        steps = []
        for prev, row in pairwise(rows):
            added = row["params"] - prev["params"]
            wall = (row.get(f"{side}_wall_s") or 0) - (prev.get(f"{side}_wall_s") or 0)
            rss = (row.get(f"{side}_peak_rss_mb") or 0) - (prev.get(f"{side}_peak_rss_mb") or 0)
            steps.append(f"+{added / 1e6:.2f}M params: {wall:+.1f} s, {rss:+.0f} MB "
                         f"({rss * 2**20 / added:.0f} B/param)")
        parts.append(f"{side}: " + "; ".join(steps))
    growth = scaling.get("growth", {})
    return (" | ".join(parts) + f". The hand-written baseline's marginal slopes: wall "
            f"{growth.get('baseline_marginal_wall_slope')}, peak RSS "
            f"{growth.get('baseline_marginal_rss_slope')}. Whole cost: 100x the parameters cost "
            f"{_last_over_first(rows, 'toolkit_wall_s')}x the wall time and "
            f"{_last_over_first(rows, 'toolkit_peak_rss_mb')}x the peak RSS")


def _last_over_first(rows: list[dict], key: str) -> str:
    if len(rows) < 2 or not rows[0].get(key) or not rows[-1].get(key):
        return "?"
    return f"{rows[-1][key] / rows[0][key]:.2f}"


def section(scaling: dict, results: dict) -> list[str]:
    rows = [[r["net"], r["params"], r["toolkit_wall_s"], r.get("toolkit_cpu_s"), r["toolkit_peak_rss_mb"],
             r["baseline_wall_s"], r.get("baseline_cpu_s"), r["baseline_peak_rss_mb"], r["wall_ratio"]]
            for r in scaling.get("rows", [])]
    g = scaling.get("growth", {})
    intro = ("Untrained Keras conv nets of one family on digits input; baseline = its int8 "
             "PTQ .tflite script with evaluation.")
    notes = [(f"- log-log slope vs parameters, whole cost: wall {fmt(g.get('toolkit_wall_slope'))}, "
             f"CPU {fmt(g.get('toolkit_cpu_slope'))}, peak RSS {fmt(g.get('toolkit_rss_slope'))} "
             f"(baseline wall {fmt(g.get('baseline_wall_slope'))})"),
             (f"- cost above the 0.1M net vs parameters added: wall "
             f"{fmt(g.get('toolkit_marginal_wall_slope'))}, CPU "
             f"{fmt(g.get('toolkit_marginal_cpu_slope'))}, peak RSS "
             f"{fmt(g.get('toolkit_marginal_rss_slope'))} (1.0 = linear)"), ""]
    return (["## 5. Scaling (`compress --recipe int8`, PTQ, both formats, validated)", "", intro, ""]
            + table(["net", "params", "toolkit wall s", "toolkit CPU s", "toolkit RSS MB",
                     "baseline wall s", "baseline CPU s", "baseline RSS MB", "wall ratio"], rows)
            + notes)


def _run(ctx: RunContext) -> dict:
    return run(ctx.models, ctx.log)


CASE = Case(name="scaling", run=_run, targets=targets, why_missed=why_missed, section=section,
            uses_models=("keras",), derive=derive)

"""Case 5: how the cost of `compress --recipe int8` (PTQ) grows with model size.

Three Keras conv nets of the same family (~0.1M, 1M, 10M parameters, digits input,
untrained: PTQ cost does not depend on the weights' values), each compressed by the toolkit
(both formats, validated) and by the baseline script (int8 .tflite, evaluated), A B.
Growth is the log-log slope of wall time and peak RSS against parameter count: 1.0 is
linear; below 1 means fixed costs (imports, conversion set-up) still dominate.
"""
from __future__ import annotations

import math

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

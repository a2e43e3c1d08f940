"""Why a target was missed, from the measurements themselves (no canned verdicts).

Each explanation puts the toolkit's number next to what bounds it: the hand-written
baseline on the same net, the interpreter's own start-up, or the error that stopped a case.
"""
from __future__ import annotations

from itertools import pairwise

from bench.case_scaling import marginal_slope


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
            text += (f": weight tensors alone (int8 kernels + int32 biases) are "
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
    baseline = [s for s in results["cases"]["speed"]["speedups"] if s["net"] == "conv32"
                and s["runtime"] == runtime and s["threads"] == 1 and s["side"] == "baseline"]
    text = ", ".join(f"{s['int8_speedup']}x ({s['framework']})" for s in baseline if s["int8_speedup"])
    cpu = results.get("meta", {}).get("cpu", {})
    flags = cpu.get("simd_flags", [])
    vnni = any(f in flags for f in ("avx512_vnni", "avx_vnni", "amx_int8"))
    hardware = (f"this CPU ({cpu.get('model', '?')}, SIMD: {' '.join(flags) or '?'}) has no VNNI "
                "int8 dot-product instructions, so int8 multiply-adds run at most ~2x the fp32 "
                "FMA rate (XNNPACK's int8 convolutions here are no faster than fp32)" if not vnni
                else f"this CPU ({cpu.get('model', '?')}) has VNNI")
    return (f"the hand-written baseline gets {text or 'no number'} on the same net and runtime: "
            f"the artifacts are equally quantized. {hardware}")


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
    for prev, row in pairwise(rows):
        added = row["params"] - prev["params"]
        parts.append(f"{prev['net']} -> {row['net']}: +{added / 1e6:.2f}M params cost "
                     f"+{row['toolkit_wall_s'] - prev['toolkit_wall_s']:.1f} s wall, "
                     f"+{(row.get('toolkit_cpu_s') or 0) - (prev.get('toolkit_cpu_s') or 0):.1f} s CPU, "
                     f"+{row['toolkit_peak_rss_mb'] - prev['toolkit_peak_rss_mb']:.0f} MB "
                     f"({(row['toolkit_peak_rss_mb'] - prev['toolkit_peak_rss_mb']) * 2**20 / added:.0f}"
                     " B/param)")
    growth = scaling.get("growth", {})
    text = "; ".join(parts) + (f". Whole-cost slopes (wall, CPU, RSS): {growth.get('toolkit_wall_slope')}, "
                               f"{growth.get('toolkit_cpu_slope')}, {growth.get('toolkit_rss_slope')}")
    if len(rows) >= 3:
        first, second = rows[0], rows[1]
        nudged = [dict(r) for r in rows]
        nudged[1]["toolkit_wall_s"] = second["toolkit_wall_s"] + 1.0
        moved = marginal_slope(nudged, "toolkit_wall_s")
        text += (f"; the marginal wall slope rests on one small difference "
                 f"({second['toolkit_wall_s'] - first['toolkit_wall_s']:.1f} s): one more second there "
                 f"would make it {moved}")
    return text


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

"""Case 5 (zoo): ResNet-18-, MobileNetV2- and EfficientNet-B0-style nets at 64x64, from both
frameworks, both formats: toolkit int8 vs toolkit fp32 vs the vendor tool's int8 (onnxruntime
quantize_static on our fp32 ONNX; TFLiteConverter full int8 on the Keras model). Batch-1 p50,
1 thread, every artifact of one runtime timed round-robin in one probe process.

Artifacts are built by bench/zoo_build.py, one process per framework; accuracy is top-1
agreement with the float model (the nets are random-init; see zoo_build.py).
"""
from __future__ import annotations

import json

from bench.measure import error_line, python_cmd, ratio, run_process
from bench.sides import ARTIFACTS, probe

FRAMEWORKS = ("torch", "keras")
RUNTIMES = {"onnx": "onnxruntime", "tflite": "LiteRT"}


def run(log, rounds: int = 5, runs_per_round: int = 100) -> dict:
    built, errors, runs = {}, [], []
    for framework in FRAMEWORKS:
        log(f"zoo: building {framework} artifacts")
        proc = run_process(python_cmd("-m", "bench.zoo_build", framework, ARTIFACTS / "zoo"),
                           timeout=1800)
        runs.append({"framework": framework, "process": proc.summary()})
        try:
            built[framework] = json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            errors.append(f"zoo build {framework} exited {proc.returncode}: "
                          f"{error_line(proc.stderr_tail)}")
    rows = []
    for fmt, runtime in RUNTIMES.items():
        group = [(framework, net, label, path) for framework, nets in built.items()
                 for net, paths in nets.items() for label, path in paths.items()
                 if label.endswith(f"_{fmt}")]
        if not group:
            continue
        log(f"zoo: {runtime}, 1 thread, {len(group)} artifacts round-robin")
        timed, error = probe("latency", [g[3] for g in group], "--threads", "1",
                             "--rounds", str(rounds), "--runs", str(runs_per_round))
        if error:
            errors.append(f"zoo {runtime}: {error}")
        for framework, net, label, path in group:
            side, recipe = label.split("_")[:2]
            rows.append({"net": net, "framework": framework, "runtime": runtime, "format": fmt,
                         "side": side, "recipe": recipe, "path": path,
                         **(timed or {}).get(path, {"error": error})})
    for framework, nets in built.items():
        for net, paths in nets.items():
            mine = [r for r in rows if r["framework"] == framework and r["net"] == net]
            scored, error = probe("evaluate", [r["path"] for r in mine], "--data", paths["val"])
            if error:
                errors.append(f"zoo evaluate {net}/{framework}: {error}")
            by_path = {s["path"]: s for s in scored or []}
            for row in mine:
                row["accuracy"] = by_path.get(row["path"], {}).get("accuracy")
    return {"rows": rows, "ratios": ratios(rows), "runs": runs, "errors": errors}


def ratios(rows: list[dict]) -> list[dict]:
    """Per (net, framework, runtime): toolkit int8 p50 / toolkit fp32 p50 and / vendor int8."""
    out = []
    for key in dict.fromkeys((r["net"], r["framework"], r["runtime"]) for r in rows):
        pick = {(r["side"], r["recipe"]): r for r in rows if (r["net"], r["framework"],
                                                                r["runtime"]) == key}
        int8, fp32 = pick.get(("toolkit", "int8"), {}), pick.get(("toolkit", "fp32"), {})
        vendor = pick.get(("vendor", "int8"), {})
        out.append({"net": key[0], "framework": key[1], "runtime": key[2],
                    "fp32_p50_ms": fp32.get("p50_ms"), "int8_p50_ms": int8.get("p50_ms"),
                    "vendor_int8_p50_ms": vendor.get("p50_ms"),
                    "int8_vs_fp32": ratio(int8.get("p50_ms"), fp32.get("p50_ms"), 3),
                    "int8_vs_vendor": ratio(int8.get("p50_ms"), vendor.get("p50_ms"), 3),
                    "int8_accuracy": int8.get("accuracy"),
                    "vendor_accuracy": vendor.get("accuracy")})
    return out

"""Case 14 (cnn_bf16, issue 39): what `precision: bf16` saves when a classic PyTorch CNN trains
(the language models' is in llm_train). The bench's 32x32x3 conv net (bench/prepare.py,
conv32.pt2, labels its own float predictions; three 3x3 convolutions, two max pools) through
int8_qat and bench/recipes/int8_qat_bf16.yaml (`--data conv32_nchw.npz --threads 1`): the
training's heap peak over before (report.json `training`, judged; the RSS increase beside it)
and each artifact's top-1 agreement. A minute on 2 cores.
"""
from __future__ import annotations

import shutil

from bench.case import Case, RunContext, case_results, not_measured, target
from bench.compress_runs import (TRAINING_COLUMNS, arts, bf16_peaks, check_copies, compress_row,
                                 load, timings, training_cells)
from bench.markdown import table
from bench.measure import ratio, worst
from bench.sides import ARTIFACTS, BENCH_RECIPES

WORK = ARTIFACTS / "cnn_bf16"
NET = "conv32"   # 32x32x3: activations worth measuring (the 8x8 digits net's are KBs)
RUNS = {"int8_qat": "int8_qat", "int8_qat_bf16": str(BENCH_RECIPES / "int8_qat_bf16.yaml")}
COPIES = {"int8_qat_bf16": "int8_qat"}
GOALS = {"peak_ratio": 0.65, "accuracy_off": 0.005}


def run(ctx: RunContext) -> dict:
    errors, runs = [], []
    shutil.rmtree(WORK, ignore_errors=True)
    copies = check_copies("cnn_bf16", COPIES, errors)
    entry = (ctx.models.get("torch") or {}).get(NET)
    if not entry:
        errors.append(f"cnn_bf16: no prepared torch {NET} net (bench/prepare.py)")
        return {"errors": errors, "recipe_copies": copies}
    rows = {}
    for label, recipe in RUNS.items():
        ctx.log(f"cnn_bf16: torch {NET} {label}")
        row = compress_row(runs, errors, f"cnn_bf16 {label}", entry["model"], recipe,
                           entry["data"], WORK / label, None)
        if row:
            rows[label] = row
    return {"net": NET, "framework": "torch", "model": entry["model"], "rows": rows,
            "recipe_copies": copies, "runs": runs, "errors": errors}


def derive(case: dict) -> None:
    rows = case.get("rows") or {}
    fp32, bf16 = arts(rows, "int8_qat"), arts(rows, "int8_qat_bf16")
    off = {f: round(abs(a["metric_value"] - fp32[f]["metric_value"]), 5) for f, a in bf16.items()
           if a.get("metric_value") is not None
           and (fp32.get(f) or {}).get("metric_value") is not None}
    case["summary"] = {
        **bf16_peaks(rows, "int8_qat_bf16", "int8_qat"),
        "process_peak_rss_ratio": ratio((rows.get("int8_qat_bf16") or {}).get(
            "process_peak_rss_bytes"), (rows.get("int8_qat") or {}).get("process_peak_rss_bytes")),
        "bf16_accuracy_off_by_format": off or None, "bf16_accuracy_off": worst(off.values())}


def targets(results: dict) -> dict:
    s = case_results(results, "cnn_bf16").get("summary") or {}
    return {
        "cnn_bf16_peak_heap": target(
            s.get("bf16_peak_ratio"), GOALS["peak_ratio"], "<=",
            "PyTorch CNN int8_qat training peak memory increase (report.json training: heap in "
            "use) in bf16 / in fp32", f"{NET} CNN (.pt2), measured by "
            f"{s.get('bf16_peak_measure')}; training peak RSS increase ratio "
            f"{s.get('bf16_peak_rss_ratio')}; whole-process peak RSS ratio "
            f"{s.get('process_peak_rss_ratio')} (not the training's)"),
        "cnn_bf16_accuracy": target(
            s.get("bf16_accuracy_off"), GOALS["accuracy_off"], "<=",
            "abs(PyTorch CNN int8_qat artifact accuracy trained in bf16 - in fp32)",
            f"{NET} CNN, worse of ONNX / TFLite; {s.get('bf16_accuracy_off_by_format')}"),
    }


def why_missed(name: str, target: dict, results: dict) -> str:
    case = case_results(results, "cnn_bf16")
    if target["value"] is None:
        return not_measured(results, "cnn_bf16") + "".join(
            f"; {e}" for e in case.get("errors", []))
    return "; ".join(f"{label}: " + ", ".join(f"{f} accuracy {a.get('metric_value')}"
                                              for f, a in row.get("artifacts", {}).items())
                     + f", training {row.get('training')}"
                     for label, row in (case.get("rows") or {}).items())


def section(case: dict, results: dict) -> list[str]:
    s = case.get("summary") or {}
    lines = [f"## 14. PyTorch CNN QAT in bf16: {case.get('net')} (.pt2), int8_qat fp32 vs bf16",
             "", "`compress --recipe int8_qat|bench/recipes/int8_qat_bf16.yaml conv32.pt2 "
             "--data conv32_nchw.npz --threads 1`; accuracy (top-1 agreement with the float "
             "net) of each artifact on the val split; training peak heap / RSS from report.json "
             "`training`, process peak RSS the whole command's (wait4). bf16 / fp32 training "
             f"heap peak {s.get('bf16_peak_ratio')}; abs(bf16 - fp32) accuracy: "
             f"{s.get('bf16_accuracy_off_by_format')}; bf16 / fp32 process peak RSS "
             f"{s.get('process_peak_rss_ratio')}.", ""]
    body = []
    for label, row in (case.get("rows") or {}).items():
        artifacts = row.get("artifacts", {})
        body.append([label, row.get("exit_code"), row.get("baseline", {}).get("value"),
                     *[(artifacts.get(f) or {}).get("metric_value") for f in ("onnx", "tflite")],
                     *training_cells(row), row.get("process_peak_rss_bytes"), row.get("wall_s"),
                     timings(row), load(row)])
    return lines + table(["run", "exit", "float accuracy", "ONNX accuracy", "TFLite accuracy",
                          *TRAINING_COLUMNS, "process peak RSS B", "compress wall s",
                          "timings_s", "load at start"], body)


CASE = Case(name="cnn_bf16", run=run, targets=targets, why_missed=why_missed, section=section,
            uses_models=("torch",), derive=derive)

"""Case 6 (transformer): BERT-style encoders from Hugging Face's BertModel (int64 input_ids +
attention_mask, seq len 32): the toolkit's `int8` (dynamic int8, picked by the built-in
recipe) vs the toolkit's fp32 ONNX vs the vendor tool's own dynamic int8 (onnxruntime
`quantize_dynamic`, per-channel QInt8, bench/baselines/onnx_dynamic.py) on that same fp32
ONNX.

- size and batch-1 p50 (onnxruntime, 1 thread, the three artifacts timed round-robin in one
  probe process) on `bert6x384` (6 layers, 384 wide, random init);
- fidelity (lowest over last_hidden_state / pooler_output of the mean per-row cosine to the
  float PyTorch model's outputs, 64 val rows) on `bert2x64`, trained in the bench for a few
  seconds (see bench/transformer_build.py), and, for information, on bert6x384.
"""
from __future__ import annotations

import json
from pathlib import Path

from bench.measure import REPO, error_line, python_cmd, ratio, run_process
from bench.sides import ARTIFACTS, probe

SPEED_MODEL, FIDELITY_MODEL = "bert6x384", "bert2x64"
VENDOR_SCRIPT = REPO / "bench" / "baselines" / "onnx_dynamic.py"
LABELS = ("toolkit_fp32_onnx", "toolkit_int8_onnx", "vendor_int8_onnx")


def run(log, rounds: int = 5, runs_per_round: int = 100) -> dict:
    errors, runs = [], []
    log("transformer: building the BERT models and the toolkit's fp32 / int8 ONNX")
    proc = run_process(python_cmd("-m", "bench.transformer_build", ARTIFACTS / "transformer"),
                       timeout=1200)
    runs.append({"what": "toolkit build", "process": proc.summary()})
    try:
        built = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"rows": [], "models": {}, "runs": runs,
                "errors": [f"transformer build exited {proc.returncode}: "
                           f"{error_line(proc.stderr_tail)}"]}
    for name, entry in built.items():
        vendor = Path(entry["toolkit_fp32_onnx"]).parents[1] / "vendor" / "model.onnx"
        vendor.parent.mkdir(parents=True, exist_ok=True)
        proc = run_process(python_cmd(VENDOR_SCRIPT, entry["toolkit_fp32_onnx"], vendor))
        runs.append({"what": f"vendor {name}", "process": proc.summary()})
        if proc.ok:
            entry["vendor_int8_onnx"] = str(vendor)
        else:
            errors.append(f"vendor int8 {name} exited {proc.returncode}: "
                          f"{error_line(proc.stderr_tail)}")
    rows = []
    for name, entry in built.items():
        paths = {label: entry[label] for label in LABELS if label in entry}
        scored, error = probe("fidelity", list(paths.values()), "--data", entry["val"])
        if error:
            errors.append(f"transformer fidelity {name}: {error}")
        by_path = {s["path"]: s for s in scored or []}
        rows += [{"model": name, "side": label.split("_")[0], "recipe": label.split("_")[1],
                  "path": path, **by_path.get(path, {"error": error})}
                 for label, path in paths.items()]
    speed = [r for r in rows if r["model"] == SPEED_MODEL]
    log(f"transformer: onnxruntime, 1 thread, {len(speed)} artifacts of {SPEED_MODEL} round-robin")
    timed, error = probe("latency", [r["path"] for r in speed], "--threads", "1", "--rounds",
                         str(rounds), "--runs", str(runs_per_round), "--inputs",
                         built[SPEED_MODEL]["val"])
    if error:
        errors.append(f"transformer latency: {error}")
    for row in speed:
        row.update({k: v for k, v in (timed or {}).get(row["path"], {}).items()
                    if k in ("p50_ms", "p50_rounds", "runtime_version", "error")})
    return {"rows": rows, "models": built, "ratios": ratios(rows), "runs": runs, "errors": errors}


def ratios(rows: list[dict]) -> dict:
    """int8 vs vendor int8 (and vs fp32): size and p50 on the big model, fidelity on the
    trained one."""
    def pick(model: str, side: str, recipe: str) -> dict:
        return next((r for r in rows if (r["model"], r["side"], r["recipe"]) ==
                     (model, side, recipe)), {})

    int8, vendor = pick(SPEED_MODEL, "toolkit", "int8"), pick(SPEED_MODEL, "vendor", "int8")
    fp32 = pick(SPEED_MODEL, "toolkit", "fp32")
    trained_int8 = pick(FIDELITY_MODEL, "toolkit", "int8")
    trained_vendor = pick(FIDELITY_MODEL, "vendor", "int8")
    return {"int8_size_vs_vendor": ratio(int8.get("size_bytes"), vendor.get("size_bytes")),
            "int8_size_vs_fp32": ratio(int8.get("size_bytes"), fp32.get("size_bytes")),
            "int8_p50_vs_vendor": ratio(int8.get("p50_ms"), vendor.get("p50_ms"), 3),
            "int8_p50_vs_fp32": ratio(int8.get("p50_ms"), fp32.get("p50_ms"), 3),
            "int8_fidelity": trained_int8.get("fidelity"),
            "vendor_fidelity": trained_vendor.get("fidelity")}

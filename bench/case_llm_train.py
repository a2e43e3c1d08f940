"""Case 13 (llm_train, issue 39): what the language-model training recipes buy and cost, on
small_llama (a small Llama trained in the bench) and smollm2 (SmolLM2-135M-Instruct, real
weights; --quick: small_llama only), the llm case's builds (bench/llm_build.py, cached in
build/bench/models/llm). Every run is `compress --recipe R HF --data text --out OUT --threads
1` (latency on), its report.json read whole; targets on the worst model measured.

- int4 vs int4_qat (`--format onnx,tflite`, both models): int4_qat's perplexity increase (the
  worse format) / int4's, and its bytes against int4's per format.
- Width pruning (small_llama): lm_prune30_kd vs bench/recipes/lm_prune30_only.yaml (the same
  prune step, no distill step): how much of what pruning lost distillation gives back, per
  format; lm_prune30_kd_int4 vs int4, both `--format onnx`: parameters after / before pruning
  (report.json `pruning`) and the ONNX artifact's decode tokens/s (compress's own latency run,
  1 thread). smollm2: only the speed and parameters, from bench/recipes/lm_prune30_int4_nokd.yaml
  (the prune and int4 steps without distill: the pruned shape sets the speed, not the
  distilled values) vs int4, both `--format onnx`.
- bf16 training (both models): bench/recipes/int4_qat_bf16.yaml (int4_qat with `precision:
  bf16`) vs int4_qat: the training's peak memory (report.json `training`: the heap in use at
  its peak over before, judged; the RSS increase beside it, which also holds what malloc
  kept after frees and moves with the process's history) and the perplexity. The same for a
  PyTorch CNN's QAT is case cnn_bf16 (bench/case_cnn_bf16.py).
- Every run's whole-command wall time, so each recipe's cost on this machine is on record.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from bench.case import Case, RunContext, case_results, not_measured, target
from bench.markdown import table
from bench.compress_runs import (TRAINING_COLUMNS, arts as _arts, bf16_peaks, check_copies,
                                 compress_row, load, one, as_copied, timings, training_cells)
from bench.measure import error_line, python_cmd, ratio, run_process
from bench.measure import increase_ratio as _vs, worst as _worst
from bench.sides import ARTIFACTS, BENCH_RECIPES, MODELS

WORK = ARTIFACTS / "llm_train"
BUILT = MODELS / "llm"
# model -> its bench.llm_build step (the llm case's builds, cached)
BUILDS = {"small_llama": "train", "smollm2": "real"}
QUICK_MODELS = ("small_llama",)
# label -> (recipe, --format, the models it runs on), in the order they run (each model's two
# ONNX speed runs last and adjacent: the machine is shared, its load drifts)
RUNS = {
    "int4": ("int4", "onnx,tflite", ("small_llama", "smollm2")),
    "int4_qat": ("int4_qat", "onnx,tflite", ("small_llama", "smollm2")),
    "int4_qat_bf16": (str(BENCH_RECIPES / "int4_qat_bf16.yaml"), "onnx,tflite",
                      ("small_llama", "smollm2")),
    "prune_only": (str(BENCH_RECIPES / "lm_prune30_only.yaml"), "onnx,tflite", ("small_llama",)),
    "prune_kd": ("lm_prune30_kd", "onnx,tflite", ("small_llama",)),
    "int4_onnx": ("int4", "onnx", ("small_llama", "smollm2")),
    "prune_kd_int4": ("lm_prune30_kd_int4", "onnx", ("small_llama",)),
    "prune_int4_nokd": (str(BENCH_RECIPES / "lm_prune30_int4_nokd.yaml"), "onnx", ("smollm2",)),
}
# the pruned int4 run each model's parameter and speed ratios read
PRUNED_INT4 = {"small_llama": "prune_kd_int4", "smollm2": "prune_int4_nokd"}
# bench recipe -> the built-in it copies: checked against it before the runs (`compress recipes
# show` of both), since a built-in's defaults may move after the copy was written
COPIES = {"int4_qat_bf16": "int4_qat",
          "lm_prune30_only": "lm_prune30_kd", "lm_prune30_int4_nokd": "lm_prune30_kd_int4"}
GOALS = {"qat_vs_int4": 0.6, "qat_bytes_off": 0.005, "params_ratio": 0.72, "decode_ratio": 1.25,
         "kd_recovery": 0.5, "bf16_peak_ratio": 0.65, "bf16_ppl_off": 0.01}


def _build(runs: list, errors: list, name: str) -> dict | None:
    """The model's bench/llm_build.py step (cached): its JSON (hf folder, params, ...)."""
    proc = run_process(python_cmd("-m", "bench.llm_build", BUILDS[name], BUILT / name),
                       timeout=1800)
    runs.append({"what": f"{name} build", "process": proc.summary()})
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        errors.append(f"llm_train {name} build exited {proc.returncode}: "
                      f"{error_line(proc.stderr_tail)}")
        return None
    if isinstance(result, dict) and result.get("error"):
        errors.append(f"llm_train {name} build: {result['error']}")
        return None
    return result


def _expected(name: str, original: dict) -> dict:
    """What bench recipe `name` should be: its built-in with only the change it is for."""
    wanted = as_copied(name, original)
    if name == "lm_prune30_only":
        wanted["steps"] = [step for step in wanted["steps"] if step.get("pass") == "prune"]
    elif name == "lm_prune30_int4_nokd":
        wanted["steps"] = [step for step in wanted["steps"] if step.get("pass") != "distill"]
    return wanted


def _model(runs: list, errors: list, name: str, log) -> dict:
    built = _build(runs, errors, name)
    if not built:
        return {}
    rows = {}
    for label, (recipe, formats, models) in RUNS.items():
        if name not in models:
            continue
        log(f"llm_train {name}: {label} (compress --recipe {Path(recipe).stem} --format {formats})")
        row = compress_row(runs, errors, f"llm_train {name} {label}", built["hf"], recipe, "text",
                        WORK / name / label, formats)
        if row:
            rows[label] = row
            log(f"llm_train {name}: {label} exit {row['exit_code']}, {row['wall_s']} s, "
                + ", ".join(f"{f} +{a.get('perplexity_increase')} {a.get('size_bytes')} B "
                            f"{a.get('decode_tokens_per_s')} tok/s"
                            for f, a in row["artifacts"].items()))
    return {"model": {k: built.get(k) for k in ("hf", "family", "config", "params",
                                                "torch_perplexity", "cached")}, "rows": rows}


def run(ctx: RunContext) -> dict:
    errors, runs = [], []
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    copies = check_copies("llm_train", COPIES, errors, _expected)
    names = QUICK_MODELS if ctx.quick else tuple(BUILDS)
    models = {}
    for name in names:
        models[name] = _model(runs, errors, name, ctx.log)
        derive({"models": {name: models[name]}})   # for the log line only; judge derives again
        ctx.log(f"llm_train {name}: {json.dumps(models[name].get('summary', {}))}")
    return {"models": models, "quick": ctx.quick, "recipe_copies": copies,
            "cpu": ctx.results.get("meta", {}).get("cpu"), "runs": runs, "errors": errors}


# --- derived numbers -----------------------------------------------------------------------

def _increases(rows: dict, label: str) -> dict:
    return {f: a.get("perplexity_increase") for f, a in _arts(rows, label).items()}


def _summary(entry: dict, name: str) -> dict:
    """One model's numbers the targets read."""
    rows = entry.get("rows", {})
    int4, qat = _increases(rows, "int4"), _increases(rows, "int4_qat")
    sizes = {f: ratio(a.get("size_bytes"), _arts(rows, "int4").get(f, {}).get("size_bytes"), 6)
             for f, a in _arts(rows, "int4_qat").items()}
    bytes_off = {f: round(abs(r - 1), 6) for f, r in sizes.items() if r is not None}
    pruned = rows.get(PRUNED_INT4.get(name, "")) or {}
    speed = ratio(_arts(rows, PRUNED_INT4.get(name, "")).get("onnx", {}).get(
        "decode_tokens_per_s"), _arts(rows, "int4_onnx").get("onnx", {}).get(
        "decode_tokens_per_s"), 3)
    only, kd = _increases(rows, "prune_only"), _increases(rows, "prune_kd")
    recovery = {f: round((only[f] - kd[f]) / only[f], 4) for f in only
                if only[f] and only[f] > 0 and kd.get(f) is not None}
    fp32, bf16 = _arts(rows, "int4_qat"), _arts(rows, "int4_qat_bf16")
    ppl_off = {f: round(abs(a["perplexity"] - fp32[f]["perplexity"]) / fp32[f]["perplexity"], 5)
               for f, a in bf16.items()
               if a.get("perplexity") and (fp32.get(f) or {}).get("perplexity")}
    return {"int4_increase": _worst(int4.values()), "int4_qat_increase": _worst(qat.values()),
            "qat_vs_int4": _vs(_worst(qat.values()), _worst(int4.values())),
            "qat_bytes_off_by_format": bytes_off, "qat_bytes_off": _worst(bytes_off.values()),
            "params_ratio": ratio(pruned.get("params"), pruned.get("params_before")),
            "decode_ratio": speed,
            "kd_recovery_by_format": recovery or None,
            "kd_recovery": min(recovery.values()) if recovery else None,
            **bf16_peaks(rows, "int4_qat_bf16", "int4_qat"),
            "bf16_ppl_off_by_format": ppl_off or None,
            "bf16_ppl_off": _worst(ppl_off.values()),
            "exit_codes": {label: row.get("exit_code") for label, row in rows.items()}}


def derive(train: dict) -> None:
    """Each model's summary and the worst over the models (what the targets read)."""
    models = train.get("models") or {}
    for name, entry in models.items():
        entry["summary"] = _summary(entry, name)
    summaries = {n: e["summary"] for n, e in models.items() if e.get("summary")}
    worst = {key: _worst(s.get(key) for s in summaries.values())
             for key in ("qat_vs_int4", "qat_bytes_off", "params_ratio", "bf16_peak_ratio",
                         "bf16_ppl_off")}
    for key in ("decode_ratio", "kd_recovery"):   # higher is better: the lowest is the worst
        values = [s.get(key) for s in summaries.values() if s.get(key) is not None]
        worst[key] = min(values) if values else None
    train["worst"] = worst


# --- targets -------------------------------------------------------------------------------

def targets(results: dict) -> dict:
    train = case_results(results, "llm_train")
    worst = train.get("worst", {})
    summaries = {n: e.get("summary", {}) for n, e in (train.get("models") or {}).items()}

    def per_model(key: str) -> str:
        return "; ".join(f"{n} {s.get(key)}" for n, s in summaries.items()
                         if s.get(key) is not None) or "no model"

    return {
        "llm_train_int4_qat_ppl_vs_int4": target(
            worst.get("qat_vs_int4"), GOALS["qat_vs_int4"], "<=",
            "int4_qat perplexity increase / int4's (the worse of ONNX / TFLite of each; compress's "
            "own validation, over the torch model)", f"worst model; {per_model('qat_vs_int4')}"),
        "llm_train_int4_qat_bytes_vs_int4": target(
            worst.get("qat_bytes_off"), GOALS["qat_bytes_off"], "<=",
            "abs(int4_qat artifact bytes / int4's - 1) (ONNX folder and .tflite)",
            f"worst format and model; {per_model('qat_bytes_off_by_format')}"),
        "llm_train_prune_params": target(
            worst.get("params_ratio"), GOALS["params_ratio"], "<=",
            "parameters after lm_prune30 width pruning / before (report.json pruning)",
            f"worst model; small_llama lm_prune30_kd_int4, smollm2 lm_prune30_int4_nokd; "
            f"{per_model('params_ratio')}"),
        "llm_train_prune_int4_decode": target(
            worst.get("decode_ratio"), GOALS["decode_ratio"], ">=",
            "decode tokens/s of the pruned int4 ONNX artifact / int4's (compress's latency run, "
            "1 thread, both --format onnx)",
            f"lowest model; small_llama lm_prune30_kd_int4, smollm2 lm_prune30_int4_nokd; "
            f"{per_model('decode_ratio')}"),
        "llm_train_kd_recovery": target(
            worst.get("kd_recovery"), GOALS["kd_recovery"], ">=",
            "(prune-only increase - lm_prune30_kd increase) / prune-only increase: the share of "
            "what pruning lost that distillation gives back",
            f"small_llama, the lower of ONNX / TFLite; {per_model('kd_recovery_by_format')}"),
        "llm_train_bf16_peak_rss": target(
            worst.get("bf16_peak_ratio"), GOALS["bf16_peak_ratio"], "<=",
            "int4_qat training peak memory increase (report.json training: heap in use) in "
            "bf16 / in fp32", f"worst model; {per_model('bf16_peak_ratio')}, measured by "
            f"{per_model('bf16_peak_measure')}; training peak RSS increase ratio "
            f"{per_model('bf16_peak_rss_ratio')}"),
        "llm_train_bf16_ppl": target(
            worst.get("bf16_ppl_off"), GOALS["bf16_ppl_off"], "<=",
            "abs(int4_qat perplexity trained in bf16 - in fp32) / fp32's",
            f"worst model, worse of ONNX / TFLite; {per_model('bf16_ppl_off_by_format')}"),
    }


def why_missed(name: str, target: dict, results: dict) -> str:
    train = case_results(results, "llm_train")
    models = train.get("models") or {}
    if target["value"] is None:
        return not_measured(results, "llm_train")

    def facts(model: str, label: str, keys=("perplexity", "perplexity_increase",
                                            "size_bytes")) -> str:
        row = models.get(model, {}).get("rows", {}).get(label) or {}
        return f"{label} " + ", ".join(f"{f} " + "/".join(str(a.get(k)) for k in keys)
                                       for f, a in row.get("artifacts", {}).items())

    parts = []
    for model, entry in models.items():
        rows, s = entry.get("rows", {}), entry.get("summary", {})
        if name == "llm_train_int4_qat_ppl_vs_int4":
            parts.append(f"{model}: ratio {s.get('qat_vs_int4')} (perplexity/increase/bytes: "
                         f"{facts(model, 'int4')}; {facts(model, 'int4_qat')})")
        elif name == "llm_train_int4_qat_bytes_vs_int4":
            parts.append(f"{model}: {s.get('qat_bytes_off_by_format')} ({facts(model, 'int4')};"
                         f" {facts(model, 'int4_qat')})")
        elif name == "llm_train_prune_params" and (row := rows.get(PRUNED_INT4[model])):
            parts.append(f"{model}: {row.get('params')} / {row.get('params_before')} params "
                         f"({row.get('pruning')})")
        elif name == "llm_train_prune_int4_decode":
            parts.append(f"{model}: " + ", ".join(
                f"{label} {_arts(rows, label).get('onnx', {}).get('decode_tokens_per_s')} tok/s "
                f"({_arts(rows, label).get('onnx', {}).get('size_bytes')} B)"
                for label in (PRUNED_INT4[model], "int4_onnx")))
        elif name == "llm_train_kd_recovery" and "prune_kd" in rows:
            parts.append(f"{model}: recovery {s.get('kd_recovery_by_format')} "
                         f"({facts(model, 'prune_only')}; {facts(model, 'prune_kd')})")
        elif name == "llm_train_bf16_peak_rss" and "int4_qat_bf16" in rows:
            parts.append(f"{model}: " + ", ".join(
                f"{label} {rows.get(label, {}).get('training')}"
                for label in ("int4_qat_bf16", "int4_qat")))
        elif name == "llm_train_bf16_ppl" and "int4_qat_bf16" in rows:
            parts.append(f"{model}: {facts(model, 'int4_qat_bf16')}; {facts(model, 'int4_qat')}")
    return "; ".join(parts)


# --- RESULTS.md ----------------------------------------------------------------------------

LABEL_TEXT = {"int4": "int4", "int4_qat": "int4_qat", "int4_qat_bf16": "int4_qat (bf16)",
              "prune_only": "lm_prune30 only", "prune_kd": "lm_prune30_kd",
              "int4_onnx": "int4 (ONNX only)", "prune_kd_int4": "lm_prune30_kd_int4",
              "prune_int4_nokd": "lm_prune30 + int4, no KD"}


def section(train: dict, results: dict) -> list[str]:
    cpu = train.get("cpu") or {}
    lines = ["## 13. Language-model training recipes (int4_qat, width pruning + distillation, "
             "bf16 training)", "",
             "Every run is `compress --recipe R HF --data text --threads 1` with latency on "
             "(`--format` as listed), its report.json read whole: perplexity increase over the "
             "torch model on TextData's default evaluation windows (compress's own validation, "
             "each format in its runtime), artifact bytes, decode tokens/s (compress's latency "
             "run, 1 thread, one run per command: a shared machine's load moves it), "
             "parameters (report.json `pruning`), the training facts (report.json `training`, "
             "or `distillation` for the prune + distill recipes) and the whole command's wall "
             "time. Prune only: bench/recipes/lm_prune30_only.yaml "
             "(lm_prune30_kd's prune step, no distill); smollm2's pruned speed: "
             "bench/recipes/lm_prune30_int4_nokd.yaml (prune + int4, no distill); bf16: "
             "bench/recipes/int4_qat_bf16.yaml and int8_qat_bf16.yaml (`precision: bf16` on the "
             f"QAT step). {cpu.get('model', '?')}"
             + (", --quick: small_llama only." if train.get("quick") else "."), ""]
    models = train.get("models") or {}
    lines += table(["model", "int4_qat inc / int4 inc", "abs(int4_qat bytes / int4 - 1)",
                    "params pruned / original", "pruned int4 decode / int4",
                    "KD recovery", "bf16 / fp32 training peak (heap; RSS in rows before it)",
                    "bf16 / fp32 training peak RSS increase", "abs(bf16 ppl - fp32) / fp32"],
                   [[name, s.get("qat_vs_int4"), s.get("qat_bytes_off"), s.get("params_ratio"),
                     s.get("decode_ratio"), s.get("kd_recovery"), s.get("bf16_peak_ratio"),
                     s.get("bf16_peak_rss_ratio"), s.get("bf16_ppl_off")]
                    for name, s in ((n, e.get("summary", {})) for n, e in models.items())])
    for name, entry in models.items():
        lines += _model_lines(name, entry)
    lines += _wall_lines(train)
    return lines


def _percent(value: float | None) -> str | None:
    """A perplexity increase as a signed percentage (3 decimals would hide it)."""
    return None if value is None else f"{value * 100:+.2f}%"


def _model_lines(name: str, entry: dict) -> list[str]:
    model = entry.get("model") or {}
    lines = [f"### {name}", "",
             f"{model.get('family')}, {model.get('params')} params, torch perplexity "
             f"{model.get('torch_perplexity')}.", ""]
    body = []
    for label, row in entry.get("rows", {}).items():
        arts = row.get("artifacts", {})
        body.append([LABEL_TEXT.get(label, label), row.get("formats"), row.get("exit_code"),
                     *[_percent((arts.get(f) or {}).get("perplexity_increase"))
                       for f in ("onnx", "tflite")],
                     *[(arts.get(f) or {}).get("size_bytes") for f in ("onnx", "tflite")],
                     row.get("params"), one((arts.get("onnx") or {}).get("decode_tokens_per_s")),
                     *training_cells(row), row.get("wall_s"), timings(row), load(row)])
    return lines + table(["run", "formats", "exit", "ONNX inc", "TFLite inc", "ONNX bytes",
                          "TFLite bytes", "params", "ONNX decode tok/s", *TRAINING_COLUMNS,
                          "compress wall s", "timings_s", "load at start"], body)


def _wall_lines(train: dict) -> list[str]:
    """Each recipe's whole `compress` command, seconds per model (what a recipe costs here)."""
    models = train.get("models") or {}
    labels = [label for label in RUNS if any(label in e.get("rows", {}) for e in models.values())]
    body = [[LABEL_TEXT.get(label, label), RUNS[label][1],
             *[(e.get("rows", {}).get(label) or {}).get("wall_s") for e in models.values()]]
            for label in labels]
    return (["Wall time of each whole `compress` command per model (seconds, --threads 1, "
             "latency on; other jobs share the machine's cores, and training under their load "
             "ran many times slower: see each run's load at start):", ""]
            + table(["recipe", "--format", *models], body))


CASE = Case(name="llm_train", run=run, targets=targets, why_missed=why_missed, section=section,
            derive=derive)

"""Case 12 (gguf, issue 40): the GGUF route's files against the files llama.cpp's own tools make
of the same float model, all run in llama.cpp itself, side by side, on the llm case's three
models (small_llama, qwen2, smollm2: bench/llm_build.py, cached in build/bench/models/llm;
--quick: the two small ones), every target judged on the worst of them.

Ours (`compress HF --data text --format gguf --threads 1 --no-latency`): the default `int4`
(GPTQ or rounding, Q4_0 blocks from our integers, the costliest matrices Q8_0 within 1.15x the
bytes), a pure Q4_0 variant (bench/recipes/int4_pure_q4_0.yaml: int8_budget 1.0, every matrix
at 4 bits, the token table too) and `int8` (Q8_0).

Anchors (bench/llm_gguf.py anchors): the same float HF folder written by compressor's GGUF
writer fed the `gguf` package's reference quantizers, which reproduce llama.cpp's `quantize`
bit for bit for Q4_0 / Q8_0: Q4_0 on every matrix (the token table too), Q4_0 with the token
embedding / head at Q8_0, Q8_0, and F16 (the float model in llama.cpp). llama.cpp's own
`llama-quantize ... Q4_0` would store the output (or tied) table at Q6_K, which the gguf
package cannot produce (no Python K-quant quantizer): Q8_0 for the table is the nearest we
can write, a little larger and more precise than Q6_K.

Every file is scored by the same code in one process (bench/llm_gguf.py score):
LlamaCppLm(file, threads=1).predict on TextData's default evaluation windows (what `compress
--data text` validates on), perplexity = exp(-mean token log-probability); its increase over
the F16 file's llama.cpp perplexity and over the float model's torch perplexity on the same
windows (recomputed from the HF folder by the anchors step). Speed: ours pure Q4_0 vs the Q4_0
anchor, LlamaCppLm.speed(128, 64) at 1 thread, alternating, best of 3 rounds each.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from bench.case import Case, RunContext, case_results, not_measured, target
from bench.markdown import table
from bench.measure import compress_cmd, error_line, python_cmd, ratio, run_process
from bench.measure import increase_ratio as _vs, perplexity_increase as _increase, worst as _worst
from bench.sides import ARTIFACTS, BENCH_RECIPES, MODELS

WORK = ARTIFACTS / "gguf"
BUILT = MODELS / "llm"
# model -> its bench.llm_build step (the llm case's builds, cached)
BUILDS = {"small_llama": "train", "qwen2": "qwen", "smollm2": "real"}
QUICK_MODELS = ("small_llama", "qwen2")
# ours: label -> recipe
OURS = {"ours_int4": "int4", "ours_q4_0": str(BENCH_RECIPES / "int4_pure_q4_0.yaml"),
        "ours_q8_0": "int8"}
ANCHORS = ("q4_0", "q4_0_q8_table", "q8_0", "f16")   # bench/llm_gguf.py's files
LABELS = (*OURS, *ANCHORS)                            # the table's row order
# each target's goal, by the summary key it reads (the worst model's)
GOALS = {"size_off_q4_0": 0.01, "q4_0_vs_q4_0": 0.5, "int4_vs_q4_0_q8_table": 0.5,
         "decode_vs_q4_0": 0.95, "q8_0_increase": 0.005}


def _step(runs: list, errors: list, what: str, module: str, args: list, timeout: float
          ) -> dict | None:
    """One `python -m MODULE ARGS` step in a fresh process; its last stdout line is its JSON."""
    proc = run_process(python_cmd("-m", module, *args), timeout=timeout)
    runs.append({"what": what, "process": proc.summary()})
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        errors.append(f"gguf {what} exited {proc.returncode}: {error_line(proc.stderr_tail)}")
        return None
    if isinstance(result, dict) and result.get("error"):
        errors.append(f"gguf {what}: {result['error']}")
        return None
    return result


def _compress_gguf(runs: list, errors: list, what: str, hf: str, recipe: str, out: Path
                   ) -> dict | None:
    """`compress --recipe RECIPE HF --data text --format gguf --threads 1 --no-latency`: the
    file it wrote and its report's gguf row (exit 3, a failed gate, still wrote both)."""
    proc = run_process(compress_cmd("--recipe", recipe, hf, "--data", "text", "--format", "gguf",
                                    "--threads", "1", "--no-latency", "--out", out, "--force"),
                       timeout=3600)
    runs.append({"what": what, "process": proc.summary()})
    report = out / "report.json"
    if proc.returncode not in (0, 3) or not report.exists():
        errors.append(f"gguf {what}: compress exited {proc.returncode}: "
                      f"{error_line(proc.stderr_tail)}")
        return None
    data = json.loads(report.read_text())
    row = next((a for a in data["artifacts"] if a["format"] == "gguf"), None)
    if row is None:
        errors.append(f"gguf {what}: no gguf artifact in report.json")
        return None
    return {"path": str(out / row["path"]), "exit_code": proc.returncode,
            "wall_s": round(proc.wall_s, 1), "timings_s": data.get("timings_s"),
            "compress_baseline_perplexity": data["baseline"].get("perplexity"),
            **{f"compress_{k}": row.get(k) for k in ("perplexity", "perplexity_increase",
                                                     "top1_agreement", "size_bytes")}}


def _model(runs: list, errors: list, name: str, log) -> dict:
    """One model: its build, ours three files, the four anchors, all scored, the speed pair."""
    built = _step(runs, errors, f"{name} build", "bench.llm_build",
                  [BUILDS[name], BUILT / name], timeout=1800)
    if not built:
        return {}
    hf, work = built["hf"], WORK / name
    ours = {}
    for label, recipe in OURS.items():
        log(f"gguf {name}: {label} (compress --recipe {Path(recipe).stem} --format gguf)")
        if (made := _compress_gguf(runs, errors, f"{name} {label}", hf, recipe, work / label)):
            ours[label] = made
    log(f"gguf {name}: anchors {', '.join(ANCHORS)} (gguf reference quantizers)")
    written = _step(runs, errors, f"{name} anchors", "bench.llm_gguf",
                    ["anchors", hf, work / "anchors"], timeout=1800) or {}
    anchors = written.get("files", {})
    files = {label: row["path"] for label, row in {**ours, **anchors}.items()}
    log(f"gguf {name}: scoring {len(files)} files in llama.cpp")
    scored = _step(runs, errors, f"{name} score", "bench.llm_gguf",
                   ["score", hf, *(f"{label}={path}" for label, path in files.items())],
                   timeout=5400) or {}
    speed = {}
    if "ours_q4_0" in files and "q4_0" in files:
        log(f"gguf {name}: decode speed, ours pure Q4_0 vs Q4_0")
        measured = _step(runs, errors, f"{name} speed", "bench.llm_gguf",
                         ["speed", files["ours_q4_0"], files["q4_0"]], timeout=1800) or {}
        speed = {**{k: v for k, v in measured.items() if k != "files"},
                 "loadavg": [round(x, 2) for x in os.getloadavg()],
                 **{label: measured.get("files", {}).get(files[label], {})
                    for label in ("ours_q4_0", "q4_0")}}
    rows = {label: {**anchors.get(label, {}), **ours.get(label, {}),
                    **scored.get("files", {}).get(label, {})} for label in files}
    return {"model": built, "torch_perplexity": written.get("torch_perplexity"),
            "eval_windows": scored.get("eval_windows"), "rows": rows, "speed": speed}


def run(ctx: RunContext) -> dict:
    errors, runs = [], []
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    names = QUICK_MODELS if ctx.quick else tuple(BUILDS)
    models = {}
    for name in names:
        models[name] = _model(runs, errors, name, ctx.log)
        derive({"models": {name: models[name]}})   # for the log line only; judge derives again
        s = models[name].get("summary", {})
        ctx.log(f"gguf {name}: {json.dumps(s)}")
    return {"models": models, "cpu": ctx.results.get("meta", {}).get("cpu"), "runs": runs,
            "errors": errors}


# --- derived numbers -----------------------------------------------------------------------

def _summary(entry: dict) -> dict:
    """One model's numbers the targets read. A ratio of increases is taken over both bases
    (the F16 file's llama.cpp perplexity, the torch float one) and the worse kept."""
    rows = entry.get("rows", {})

    def inc(label: str, base: str):
        return rows.get(label, {}).get(f"increase_vs_{base}")

    def vs(ours: str, theirs: str):
        return _worst(_vs(inc(ours, b), inc(theirs, b)) for b in ("f16", "torch"))

    size = ratio(rows.get("ours_q4_0", {}).get("size_bytes"),
                 rows.get("q4_0", {}).get("size_bytes"), 5)
    speed = entry.get("speed") or {}
    q8 = [inc("ours_q8_0", b) for b in ("f16", "torch")]
    return {"size_vs_q4_0": size, "size_off_q4_0": round(abs(size - 1), 5) if size else None,
            "q4_0_vs_q4_0": vs("ours_q4_0", "q4_0"),
            "int4_vs_q4_0_q8_table": vs("ours_int4", "q4_0_q8_table"),
            "decode_vs_q4_0": ratio(speed.get("ours_q4_0", {}).get("decode_tokens_per_s"),
                                    speed.get("q4_0", {}).get("decode_tokens_per_s"), 3),
            "q8_0_increase": _worst(abs(v) if v is not None else None for v in q8)}


def derive(gguf: dict) -> None:
    """Each file's perplexity increase over the F16 file's and the torch model's, each model's
    summary, and the worst over the models (what the targets read)."""
    models = gguf.get("models") or {}
    for entry in models.values():
        rows = entry.get("rows", {})
        bases = {"f16": rows.get("f16", {}).get("perplexity"),
                 "torch": entry.get("torch_perplexity")}
        entry["perplexity_f16"], entry["perplexity_torch"] = bases["f16"], bases["torch"]
        for row in rows.values():
            for base, value in bases.items():
                row[f"increase_vs_{base}"] = _increase(row.get("perplexity"), value)
        entry["summary"] = _summary(entry)
    summaries = {name: e["summary"] for name, e in models.items() if e.get("summary")}
    worst = {key: _worst(s.get(key) for s in summaries.values())
             for key in ("size_off_q4_0", "q4_0_vs_q4_0", "int4_vs_q4_0_q8_table",
                         "q8_0_increase")}
    speeds = [s.get("decode_vs_q4_0") for s in summaries.values()
              if s.get("decode_vs_q4_0") is not None]
    worst["decode_vs_q4_0"] = min(speeds) if speeds else None
    gguf["worst"] = worst


# --- targets -------------------------------------------------------------------------------

def targets(results: dict) -> dict:
    gguf = case_results(results, "gguf")
    worst = gguf.get("worst", {})
    summaries = {n: e.get("summary", {}) for n, e in (gguf.get("models") or {}).items()}

    def per_model(key: str) -> str:
        return "; ".join(f"{n} {s.get(key)}" for n, s in summaries.items()) or "no model"

    return {
        "gguf_q4_0_size_vs_llamacpp": target(
            worst.get("size_off_q4_0"), GOALS["size_off_q4_0"], "<=",
            "|our pure Q4_0 .gguf bytes / llama.cpp Q4_0 .gguf bytes - 1| (every matrix Q4_0 "
            "in both)", f"worst model; ratio: {per_model('size_vs_q4_0')}"),
        "gguf_q4_0_ppl_increase_vs_llamacpp": target(
            worst.get("q4_0_vs_q4_0"), GOALS["q4_0_vs_q4_0"], "<=",
            "our pure Q4_0 perplexity increase / llama.cpp Q4_0's (both run in llama.cpp; the "
            "worse over the F16 file's and the torch float perplexity as base)",
            f"worst model; {per_model('q4_0_vs_q4_0')}"),
        "gguf_int4_ppl_increase_vs_q4_0_q8_table": target(
            worst.get("int4_vs_q4_0_q8_table"), GOALS["int4_vs_q4_0_q8_table"], "<=",
            "our default int4 .gguf (Q4_0 + Q8_0 mixed, <= 1.15x) perplexity increase / "
            "llama.cpp Q4_0 with the token table at Q8_0's (the worse of both bases)",
            f"worst model; {per_model('int4_vs_q4_0_q8_table')}"),
        "gguf_q4_0_decode_vs_llamacpp": target(
            worst.get("decode_vs_q4_0"), GOALS["decode_vs_q4_0"], ">=",
            "our pure Q4_0 decode tokens/s / llama.cpp Q4_0's (speed(128, 64), 1 thread, "
            "alternating, best of 3)", f"worst model; {per_model('decode_vs_q4_0')}"),
        "gguf_q8_0_ppl_increase": target(
            worst.get("q8_0_increase"), GOALS["q8_0_increase"], "<=",
            "|our int8 Q8_0 .gguf perplexity / the float model's - 1| (the worse of the F16 "
            "file in llama.cpp and torch)", f"worst model; {per_model('q8_0_increase')}"),
    }


def why_missed(name: str, target: dict, results: dict) -> str:
    if target["value"] is None:
        return not_measured(results, "gguf")
    models = case_results(results, "gguf").get("models") or {}
    key = {"gguf_q4_0_size_vs_llamacpp": ("size_vs_q4_0", ("ours_q4_0", "q4_0")),
           "gguf_q4_0_ppl_increase_vs_llamacpp": ("q4_0_vs_q4_0", ("ours_q4_0", "q4_0")),
           "gguf_int4_ppl_increase_vs_q4_0_q8_table": ("int4_vs_q4_0_q8_table",
                                                       ("ours_int4", "q4_0_q8_table")),
           "gguf_q4_0_decode_vs_llamacpp": ("decode_vs_q4_0", ("ours_q4_0", "q4_0")),
           "gguf_q8_0_ppl_increase": ("q8_0_increase", ("ours_q8_0", "f16"))}[name]
    parts = []
    for model, entry in models.items():
        rows, speed = entry.get("rows", {}), entry.get("speed") or {}
        facts = ", ".join(
            f"{label} {rows.get(label, {}).get('size_bytes')} B, ppl "
            f"{rows.get(label, {}).get('perplexity')} (+{rows.get(label, {}).get('increase_vs_f16')}"
            f" vs F16, +{rows.get(label, {}).get('increase_vs_torch')} vs torch)"
            + (f", {speed[label].get('decode_tokens_per_s')} tok/s" if label in speed else "")
            for label in key[1])
        parts.append(f"{model}: {key[0]} {entry.get('summary', {}).get(key[0])} ({facts})")
    return "; ".join(parts)


# --- RESULTS.md ----------------------------------------------------------------------------

def section(gguf: dict, results: dict) -> list[str]:
    cpu = gguf.get("cpu") or {}
    lines = ["## 12. GGUF route (ours vs llama.cpp's own Q4_0 / Q8_0, all run in llama.cpp)", "",
             "Ours: `compress --recipe int4` (default: Q4_0 + Q8_0 mixed within 1.15x), "
             "bench/recipes/int4_pure_q4_0.yaml (every matrix Q4_0) and `--recipe int8` (Q8_0), "
             "each `--data text --format gguf --threads 1 --no-latency`. Anchors: the same float "
             "HF folder through compressor's GGUF writer with the `gguf` package's reference "
             "quantizers (llama.cpp's Q4_0 / Q8_0 rounding bit for bit): Q4_0 everywhere, Q4_0 "
             "with the token table at Q8_0 (llama-quantize would write Q6_K there; no Python "
             "quantizer makes Q6_K), Q8_0, F16. Every file scored by the same code, "
             "LlamaCppLm(file, threads=1).predict on TextData's default evaluation windows; "
             "increase over the F16 file's llama.cpp perplexity and over the float model's torch "
             "perplexity. Decode: speed(128, 64) at 1 thread, ours pure Q4_0 and the Q4_0 anchor "
             f"alternating, best of 3; {cpu.get('model', '?')}. Targets are judged on the worst "
             "model.", ""]
    models = gguf.get("models") or {}
    lines += table(["model", "pure bytes / Q4_0", "pure inc / Q4_0 inc", "int4 inc / Q4_0+Q8 "
                    "table inc", "pure decode / Q4_0", "int8 |ppl / float - 1|"],
                   [[name, s.get("size_vs_q4_0"), s.get("q4_0_vs_q4_0"),
                     s.get("int4_vs_q4_0_q8_table"), s.get("decode_vs_q4_0"),
                     s.get("q8_0_increase")]
                    for name, s in ((n, e.get("summary", {})) for n, e in models.items())])
    for name, entry in models.items():
        lines += _model_lines(name, entry)
    return lines


def _model_lines(name: str, entry: dict) -> list[str]:
    model, speed = entry.get("model") or {}, entry.get("speed") or {}
    lines = [f"### {name}", "",
             f"{model.get('family')}, {model.get('params')} params; torch perplexity "
             f"{entry.get('perplexity_torch')}, F16 file in llama.cpp "
             f"{entry.get('perplexity_f16')}, on {entry.get('eval_windows')} windows; load "
             f"average {speed.get('loadavg')} after the speed runs.", ""]
    rows = entry.get("rows", {})
    body = [[label, r.get("exit_code"), r.get("size_bytes"), _types(r.get("tensor_types")),
             r.get("perplexity"), _percent(r.get("increase_vs_f16")),
             _percent(r.get("increase_vs_torch")),
             r.get("top1_vs_f16"), (speed.get(label) or {}).get("decode_tokens_per_s"),
             r.get("wall_s")]
            for label in LABELS if (r := rows.get(label))]
    return lines + table(["file", "exit", "bytes", "tensors", "perplexity", "inc vs F16",
                          "inc vs torch", "top-1 vs F16", "decode tok/s", "compress s"], body)


def _percent(value: float | None) -> str | None:
    """A perplexity increase as a signed percentage (the table's 3 decimals would hide it)."""
    return None if value is None else f"{value * 100:+.2f}%"


def _types(counts: dict | None) -> str | None:
    return " ".join(f"{k} {v}" for k, v in sorted(counts.items())) if counts else None


CASE = Case(name="gguf", run=run, targets=targets, why_missed=why_missed, section=section,
            derive=derive)

"""Case 11 (llm, issues 25 and 26): a small Llama trained in the bench on the built-in text
(bench/llm_build.py) through our `int4` and our float32 export (the `compress` CLI, --threads 1)
and through onnxruntime-genai's own builder `-p int4` (block 32, accuracy_level 4) on the same
HF folder. The three folders are scored by the same code in one process: perplexity from
open_lm_runtime(...).predict on TextData's default evaluation windows, speed(512, 64) at 1
thread, round-robin. The small LM's float32 weights (~4 MB) fit this CPU's caches, so the same
three folders are also made from a random-init Llama of SmolLM-135M's shape (float32 0.54 GB:
decoding bound by the bytes it reads, as on a board), and the decode-speed targets are judged
there. Beside them: the `host` plan's decode bounds (issue 26) and the peak RSS of
`compress --recipe int4` on a ~1B-parameter random-init bf16 Llama (issue 25).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from bench.case import Case, RunContext, case_results, not_measured, target
from bench.markdown import fmt, table
from bench.measure import compress_cmd, error_line, python_cmd, ratio, run_process
from bench.sides import ARTIFACTS, BENCH_RECIPES

WORK = ARTIFACTS / "llm"
LABELS = ("ours_int4", "ours_fp32", "builder_int4")
RECIPES = {"ours_int4": "int4", "ours_fp32": str(BENCH_RECIPES / "fp32_lm_mid.yaml")}
MID_RECIPES = {"ours_int4": str(BENCH_RECIPES / "int4_rtn_mid.yaml"),
               "ours_fp32": str(BENCH_RECIPES / "fp32_lm_mid.yaml")}
BIG_RECIPES = {"rtn": BENCH_RECIPES / "int4_rtn_1b.yaml", "gptq": BENCH_RECIPES / "int4_gptq_1b.yaml"}
# GPTQ on the 1B model's 16 layers: minutes on a free 2-core box, far more on a loaded one;
# BENCH_LLM_GPTQ=1 adds it to the run (the RTN run is always made).
BIG_GPTQ = os.environ.get("BENCH_LLM_GPTQ") == "1"
BIG_SPEED = ("64", "32")   # prefill, decode tokens of the 1B int4's speed (1 thread)
BIG_CONTEXT = "256"        # the 1B artifact's KV cache (and its plan's context)
SMALL_CONTEXT = 512        # the small LM's positions: its artifacts' context and its plan's
RSS_GOAL = 1.5


def _step(runs: list, errors: list, what: str, args: list, timeout: float) -> dict | None:
    """One bench/llm_build.py step in a fresh process; its last stdout line is its JSON."""
    proc = run_process(python_cmd("-m", "bench.llm_build", *args), timeout=timeout)
    runs.append({"what": what, "process": proc.summary()})
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        errors.append(f"llm {what} exited {proc.returncode}: {error_line(proc.stderr_tail)}")
        return None


def _compress(runs: list, errors: list, what: str, hf: str, recipe: str, out: Path,
              *extra: str, timeout: float = 1800) -> dict | None:
    """`compress --recipe RECIPE HF --data text --out OUT --format onnx --threads 1`: its
    report.json (exit 3, a failed gate, still wrote one)."""
    proc = run_process(compress_cmd("--recipe", recipe, hf, "--data", "text", "--out", out,
                                    "--format", "onnx", "--threads", "1", "--force", *extra),
                       timeout=timeout)
    runs.append({"what": what, "process": proc.summary()})
    report = out / "report.json"
    if proc.returncode not in (0, 3) or not report.exists():
        errors.append(f"llm {what}: compress exited {proc.returncode}: "
                      f"{error_line(proc.stderr_tail)}")
        return None
    data = json.loads(report.read_text())
    art = data["artifacts"][0]
    return {"exit_code": proc.returncode, "folder": str(out / art["path"]),
            "baseline_perplexity": data["baseline"].get("perplexity"),
            "compress_peak_rss_bytes": data.get("compress_peak_rss_bytes"),
            "process_peak_rss_bytes": int(proc.peak_rss_mb * 2**20), "wall_s": round(proc.wall_s, 1),
            "timings_s": data.get("timings_s"),
            "report": {k: art.get(k) for k in (
                "perplexity", "perplexity_increase", "decode_tokens_per_s", "prefill_ms",
                "peak_rss_bytes", "size_bytes", "threads", "weight_share_at_bits", "top1_agreement")}}


def _builder(runs: list, errors: list, hf: str, out: Path) -> str | None:
    """onnxruntime-genai's model builder as its users run it, on the same HF folder."""
    shutil.rmtree(out, ignore_errors=True)
    proc = run_process(python_cmd("-m", "onnxruntime_genai.models.builder", "-i", hf, "-o", out,
                                  "-p", "int4", "-e", "cpu", "-c", out.parent / "builder-cache",
                                  "--extra_options", "block_size=32", "accuracy_level=4"),
                       timeout=1800)
    runs.append({"what": "builder int4", "process": proc.summary()})
    if not proc.ok or not (out / "genai_config.json").exists():
        errors.append(f"llm builder int4 exited {proc.returncode}: {error_line(proc.stderr_tail)}")
        return None
    return str(out)


def _three_folders(runs: list, errors: list, what: str, hf: str, recipes: dict, *extra: str
                   ) -> tuple[dict, dict]:
    """Our int4 and fp32 folders (compress) and the builder's int4 of `hf`, scored round-robin
    in one process: (rows by label, the scoring's settings)."""
    ours = {label: _compress(runs, errors, f"{what} {label}", hf, recipe, WORK / what / label,
                             *extra)
            for label, recipe in recipes.items()}
    folders = {label: o["folder"] for label, o in ours.items() if o}
    if (builder := _builder(runs, errors, hf, WORK / what / "builder_int4")):
        folders["builder_int4"] = builder
    load = [round(x, 2) for x in os.getloadavg()]
    scored = _step(runs, errors, f"{what} score", ["score", hf, *folders.values()],
                   timeout=3600) or {}
    rows = {label: {**scored.get("folders", {}).get(folder, {}), "folder": folder,
                    "compress": ours.get(label)} for label, folder in folders.items()}
    for row in rows.values():
        row.pop("speeds", None)
    settings = {k: v for k, v in scored.items() if k != "folders"}
    return rows, {**settings, "loadavg_at_scoring": load}


def _mid(runs: list, errors: list, quick: bool) -> dict:
    """The SmolLM-135M-shaped random-init Llama: decode speed of our int4 vs our fp32 vs the
    builder's int4 where the weights do not fit the caches."""
    built = _step(runs, errors, "mid build", ["mid", WORK / "mid-hf", *(["--quick"] if quick else [])],
                  timeout=1800)
    if not built:
        return {}
    rows, scoring = _three_folders(runs, errors, "mid", built["hf"], MID_RECIPES, "--no-latency")
    return {"model": built, "rows": rows, "scoring": scoring}


def _big(runs: list, errors: list, quick: bool) -> dict:
    """The ~1B bf16 Llama through `compress --recipe int4` (RTN; GPTQ with BENCH_LLM_GPTQ=1):
    compress_peak_rss_bytes (the compress process's and its children's RSS summed, sampled:
    compressor/core/memory.py) / the bf16 checkpoint's bytes."""
    built = _step(runs, errors, "1B build", ["big", WORK / "big-hf", *(["--quick"] if quick else [])],
                  timeout=1800)
    if not built:
        return {}
    out = {"model": built, "runs": {}}
    for algorithm, recipe in BIG_RECIPES.items():
        if algorithm == "gptq" and not BIG_GPTQ:
            continue
        result = _compress(runs, errors, f"1B int4 {algorithm}", built["hf"], str(recipe),
                           WORK / f"big-{algorithm}", "--no-latency", "--context", BIG_CONTEXT,
                           timeout=5400)
        if result:
            result["rss_ratio"] = ratio(result["compress_peak_rss_bytes"], built["checkpoint_bytes"])
            out["runs"][algorithm] = result
    rtn = out["runs"].get("rtn")
    if rtn:
        out["speed"] = _step(runs, errors, "1B int4 speed", ["speed", rtn["folder"], *BIG_SPEED],
                             timeout=900)
        out["plan"] = _step(runs, errors, "1B plan", ["plan", built["hf"], BIG_CONTEXT], timeout=300)
    return out


def run(ctx: RunContext) -> dict:
    errors, runs = [], []
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    quick = ["--quick"] if ctx.quick else []
    ctx.log("llm: training the small Llama")
    trained = _step(runs, errors, "train", ["train", WORK / "hf", *quick], timeout=1800)
    if not trained:
        return {"runs": runs, "errors": errors}
    hf = trained["hf"]
    ctx.log("llm: our int4 and fp32 (compress), the builder's int4, scored round-robin")
    rows, scoring = _three_folders(runs, errors, "small", hf, RECIPES)
    plan = _step(runs, errors, "plan", ["plan", hf, str(SMALL_CONTEXT)], timeout=300)
    ctx.log("llm: the same three folders of a SmolLM-135M-shaped Llama (decode speed)")
    mid = _mid(runs, errors, ctx.quick)
    ctx.log("llm: the ~1B Llama through compress --recipe int4 (peak RSS)")
    big = _big(runs, errors, ctx.quick)
    return {"model": trained, "rows": rows, "scoring": scoring, "plan": plan, "mid": mid,
            "big": big, "cpu": ctx.results.get("meta", {}).get("cpu"),
            "loadavg_at_scoring": scoring.get("loadavg_at_scoring"), "runs": runs,
            "errors": errors}


def derive(llm: dict) -> None:
    """Perplexity increases over the torch model's perplexity (the same windows), the ratios the
    targets read, and each artifact's efficiency against the host plan's decode bound."""
    base = (llm.get("model") or {}).get("torch_perplexity")
    rows = llm.get("rows", {})
    for row in rows.values():
        if base and row.get("perplexity"):
            row["perplexity_increase"] = round(row["perplexity"] / base - 1, 5)
    bounds = (llm.get("plan") or {}).get("bounds", {})
    for label, recipe in (("ours_int4", "int4"), ("ours_fp32", "fp32"), ("builder_int4", "int4")):
        if label in rows:
            rows[label]["decode_bound"] = bounds.get(recipe)
            rows[label]["efficiency"] = ratio(rows[label].get("decode_tokens_per_s"),
                                              bounds.get(recipe))
    big = llm.get("big") or {}
    if big.get("speed") and big.get("plan"):
        big["efficiency"] = ratio(big["speed"].get("decode_tokens_per_s"),
                                  big["plan"]["bounds"].get("int4"))
    ours, fp32, vendor = (rows.get(k, {}) for k in LABELS)
    increase, vendor_increase = ours.get("perplexity_increase"), vendor.get("perplexity_increase")
    llm["ratios"] = {
        "size_vs_builder": ratio(ours.get("size_bytes"), vendor.get("size_bytes")),
        "increase_vs_builder": ratio(increase, vendor_increase) if vendor_increase else None,
        **_decode_ratios(rows, "small_"),
        **_decode_ratios((llm.get("mid") or {}).get("rows", {})),
        "rss_ratio": max((r["rss_ratio"] for r in big.get("runs", {}).values()
                          if r.get("rss_ratio")), default=None),
    }


def _decode_ratios(rows: dict, prefix: str = "") -> dict:
    ours, fp32, vendor = (rows.get(k, {}).get("decode_tokens_per_s") for k in LABELS)
    return {f"{prefix}decode_vs_builder": ratio(ours, vendor, 3),
            f"{prefix}decode_vs_fp32": ratio(ours, fp32, 3)}


def targets(results: dict) -> dict:
    llm = case_results(results, "llm")
    r, rows = llm.get("ratios", {}), llm.get("rows", {})
    ours, vendor = rows.get("ours_int4", {}), rows.get("builder_int4", {})
    where = "small Llama trained in the bench, onnxruntime-genai 1 thread"
    increase = ours.get("perplexity_increase")
    big = llm.get("big") or {}
    mid_params = ((llm.get("mid") or {}).get("model") or {}).get("params")
    mid = f"SmolLM-135M-shaped random-init Llama ({fmt(mid_params)} params), onnxruntime-genai 1 thread"
    return {
        "llm_int4_size_vs_builder": target(
            r.get("size_vs_builder"), 1.02, "<=", "our int4 folder size / onnxruntime-genai "
            "builder -p int4 (block 32) folder size", where),
        "llm_int4_ppl_increase_vs_builder": target(
            r.get("increase_vs_builder"), 0.5, "<=", "our int4 perplexity increase / the "
            "builder's (over the torch model's, same held-out windows)",
            f"ours {increase}, builder {vendor.get('perplexity_increase')}"),
        "llm_int4_ppl_increase": target(
            increase, 0.10, "<=", "our int4 perplexity / torch model's - 1", where),
        "llm_int4_decode_vs_builder": target(
            r.get("decode_vs_builder"), 0.95, ">=", "our int4 decode tokens/s / the builder's "
            "int4, batch 1", f"{mid}, after a {ours.get('prefill_tokens')}-token prefill; small "
            f"trained Llama: {r.get('small_decode_vs_builder')}"),
        "llm_int4_decode_vs_fp32": target(
            r.get("decode_vs_fp32"), 2.0, ">=", "our int4 decode tokens/s / our fp32 folder's",
            f"{mid}; small trained Llama (weights in cache): {r.get('small_decode_vs_fp32')}"),
        "llm_compress_rss_vs_bf16": target(
            r.get("rss_ratio"), RSS_GOAL, "<=", "compress --recipe int4 peak RSS (process "
            "tree summed) / bf16 checkpoint bytes, ~1B random-init Llama",
            f"{(big.get('model') or {}).get('params')} params, algorithms "
            f"{sorted(big.get('runs', {}))} (worst kept)"),
    }


def why_missed(name: str, target: dict, results: dict) -> str:
    if target["value"] is None:
        return not_measured(results, "llm")
    llm = results["cases"]["llm"]
    if name == "llm_compress_rss_vs_bf16":
        return "; ".join(f"{a}: {r['compress_peak_rss_bytes']} B peak vs "
                         f"{llm['big']['model']['checkpoint_bytes']} B checkpoint"
                         for a, r in llm["big"]["runs"].items())
    rows = llm.get("rows", {})
    if name.startswith("llm_int4_decode"):
        return "; ".join(f"{label}: {r.get('size_bytes')} B, {r.get('decode_tokens_per_s')} "
                         "tokens/s" for label, r in (llm.get("mid") or {}).get("rows", {}).items())
    ours, vendor = rows.get("ours_int4", {}), rows.get("builder_int4", {})
    if name == "llm_int4_size_vs_builder" and ours.get("size_bytes") and vendor.get("size_bytes"):
        return (f"ours is {ours['size_bytes'] - vendor['size_bytes']:,} B larger: int4 zero points "
                f"{fmt(ours.get('zero_point_bytes'))} B vs the builder's "
                f"{fmt(vendor.get('zero_point_bytes'))} (its int4 is symmetric), graph "
                f"{fmt(ours.get('graph_bytes'))} B vs {fmt(vendor.get('graph_bytes'))}")
    if name == "llm_int4_ppl_increase_vs_builder":
        return (f"the builder's round-to-nearest int4 costs this model only "
                f"{vendor.get('perplexity_increase')} (ours {ours.get('perplexity_increase')})")
    return "; ".join(f"{label}: {r.get('size_bytes')} B, perplexity {r.get('perplexity')}, "
                     f"{r.get('decode_tokens_per_s')} tokens/s"
                     for label, r in rows.items())


def section(llm: dict, results: dict) -> list[str]:
    model, rows = llm.get("model") or {}, llm.get("rows", {})
    cpu = llm.get("cpu") or {}
    flags = ", ".join(cpu.get("simd_flags", [])) or "none"
    speed_facts = (f"1 thread, {cpu.get('model', '?')} (SIMD: {flags}), load average "
                   f"{llm.get('loadavg_at_scoring')} at scoring")
    table_rows = [[label, r.get("size_bytes"), r.get("int4_share"), r.get("perplexity"),
                   r.get("perplexity_increase"), r.get("threads"), r.get("decode_tokens_per_s"),
                   r.get("prefill_ms"),
                   r.get("peak_rss_bytes"), r.get("decode_bound"), r.get("efficiency")]
                  for label, r in rows.items()]
    lines = ["## 11. Language model (int4 vs fp32 vs onnxruntime-genai's builder)", "",
             f"Llama {model.get('config')} ({fmt(model.get('params'))} params), trained "
             f"{model.get('train_s')} s on the built-in corpus's calibration text; torch "
             f"perplexity {model.get('torch_perplexity')} on TextData's default evaluation windows "
             f"{model.get('eval_windows')}. Ours: `compress --recipe int4` / bench/recipes/"
             "fp32_lm.yaml `--format onnx --threads 1`; builder: `python -m "
             "onnxruntime_genai.models.builder -p int4 -e cpu --extra_options block_size=32 "
             "accuracy_level=4`. Every folder scored by the same code (open_lm_runtime: predict "
             f"on those windows, speed(512, 64) median of {(llm.get('scoring') or {}).get('rounds')}"
             f" round-robin rounds); {speed_facts}. Bound: `compress plan --target host`'s "
             "decode tokens/s upper bound; efficiency = measured / bound.", ""]
    lines += table(["artifact", "bytes", "4-bit share", "perplexity", "increase", "threads",
                    "decode tok/s",
                    "prefill ms", "peak RSS B", "host bound tok/s", "efficiency"], table_rows)
    lines += _mid_lines(llm.get("mid") or {})
    lines += _big_lines(llm.get("big") or {})
    return lines


def _mid_lines(mid: dict) -> list[str]:
    model, rows = mid.get("model") or {}, mid.get("rows", {})
    scoring = mid.get("scoring") or {}
    when = scoring.get("note") or f"load average {scoring.get('loadavg_at_scoring')} at scoring"
    lines = [f"Decode speed where the weights do not fit the caches: random-init Llama "
             f"{model.get('config')} ({fmt(model.get('params'))} params, SmolLM-135M's shape) saved "
             "in bfloat16, the same three folders (ours: bench/recipes/int4_rtn_mid.yaml, "
             "round to nearest; fp32_lm_mid.yaml), scored the same way (perplexity of random "
             f"weights means nothing here); {when}.", ""]
    return lines + table(["artifact", "bytes", "4-bit share", "threads", "decode tok/s",
                          "prefill ms", "peak RSS B"],
                         [[label, r.get("size_bytes"), r.get("int4_share"), r.get("threads"),
                           r.get("decode_tokens_per_s"), r.get("prefill_ms"),
                           r.get("peak_rss_bytes")] for label, r in rows.items()])


def _big_lines(big: dict) -> list[str]:
    model = big.get("model") or {}
    rows = [[algorithm, r.get("exit_code"), r.get("wall_s"), r.get("compress_peak_rss_bytes"),
             r.get("process_peak_rss_bytes"), model.get("checkpoint_bytes"), r.get("rss_ratio")]
            for algorithm, r in big.get("runs", {}).items()]
    speed, plan = big.get("speed") or {}, big.get("plan") or {}
    lines = [f"Peak RSS while compressing: random-init Llama {model.get('config')} "
             f"({fmt(model.get('params'))} params) saved in bfloat16; bench/recipes/int4_rtn_1b.yaml"
             " (round-to-nearest: GPTQ on 16 layers of this size takes far longer on 2 cores; "
             "int4_gptq_1b.yaml with BENCH_LLM_GPTQ=1), 4 calibration / 2 evaluation windows of 64"
             " tokens, --context 256, no latency. compress_peak_rss_bytes is the peak of the "
             "compress process's and its children's RSS summed (sampled every 25 ms, never below "
             "either process's own peak); process peak RSS is the compress process's own (wait4).",
             ""]
    lines += table(["algorithm", "exit", "wall s", "compress_peak_rss_bytes", "process peak RSS B",
                    "bf16 checkpoint B", "ratio"], rows)
    if speed:
        lines += [f"- 1B int4 (rtn) decode at {speed.get('threads')} thread(s) after a "
                  f"{speed.get('prefill_tokens')}-token "
                  f"prefill: {speed.get('decode_tokens_per_s')} tokens/s; host bound "
                  f"{plan.get('bounds', {}).get('int4')} tokens/s (bandwidth "
                  f"{(plan.get('device') or {}).get('bandwidth_bytes_per_s')} B/s); efficiency "
                  f"{big.get('efficiency')}", ""]
    return lines


def _run(ctx: RunContext) -> dict:
    return run(ctx)


CASE = Case(name="llm", run=_run, targets=targets, why_missed=why_missed, section=section,
            derive=derive)

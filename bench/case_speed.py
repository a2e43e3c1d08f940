"""Case 3: batch-1 p50 latency of fp32 vs int8 artifacts, 1 and 2 threads, LiteRT and onnxruntime.

Nets: the 32x32-input conv net with 64/128/128 channels (untrained, random inputs and a
few random calibration batches) and the 1M-parameter digits net. Each framework's net is
compressed by the toolkit (fp32, int8) and by its baseline script; then, per (net, runtime,
threads), one probe process opens every artifact and times them round-robin.
"""
from __future__ import annotations

from bench.case import Case, RunContext, case_results, no_reason, no_targets
from bench.markdown import table
from bench.measure import ratio
from bench.sides import ARTIFACTS, BASELINE_FORMAT, probe, run_baseline, run_toolkit

NETS = (("conv32", "keras"), ("conv32", "torch"), ("conv1m", "keras"), ("conv1m", "torch"))
RUNTIMES = {"tflite": "LiteRT", "onnx": "onnxruntime"}
RECIPES = ("fp32", "int8")


def data_spec(entry: dict) -> str:
    return entry.get("data", "digits")


def build(models: dict, size_rows: list[dict], log, torch_form: str, nets) -> tuple[list, list, list]:
    """[(net, framework, side, recipe, format, path)], process summaries, errors."""
    made, runs, errors = [], [], []
    for net, framework in nets:
        entry = models.get(framework, {}).get(net)
        if entry is None:
            errors.append(f"{net}/{framework}: model was not prepared")
            continue
        reused = [r for r in size_rows if r["net"] == net and r["framework"] == framework
                  and r["recipe"] in RECIPES and "size_bytes" in r]
        if reused:
            log(f"speed {net}/{framework}: reusing the size case's artifacts")
            made += [(net, framework, r["side"], r["recipe"], r["format"], r["path"]) for r in reused]
            continue
        where = ARTIFACTS / "speed" / f"{net}_{framework}"
        for index, recipe in enumerate(RECIPES):
            log(f"speed {net}/{framework}: toolkit {recipe}")
            tk = run_toolkit(framework, entry, recipe, data_spec(entry), where / f"toolkit_{recipe}",
                             torch_form=torch_form)
            runs.append({"net": net, "framework": framework, "recipe": recipe, **tk.summary()})
            if tk.error:
                errors.append(f"{net}/{framework} toolkit {recipe}: {tk.error}")
            made += [(net, framework, "toolkit", recipe, fmt, p) for fmt, p in tk.artifacts.items()]
            if index == 0:
                log(f"speed {net}/{framework}: baseline {','.join(RECIPES)}")
                base = run_baseline(framework, entry, list(RECIPES), data_spec(entry), where / "baseline")
                runs.append({"net": net, "framework": framework, "recipe": ",".join(RECIPES),
                             **base.summary()})
                if base.error:
                    errors.append(f"{net}/{framework} baseline: {base.error}")
                made += [(net, framework, "baseline", r, BASELINE_FORMAT[framework], p)
                         for r, p in base.artifacts.items()]
    return made, runs, errors


def run(models: dict, size_rows: list[dict], log, torch_form: str = "pt2", nets=NETS,
        threads=(1, 2), rounds: int = 5, runs_per_round: int = 100) -> dict:
    made, runs, errors = build(models, size_rows, log, torch_form, nets)
    rows = []
    for net in dict.fromkeys(n for n, _ in nets):
        for fmt, runtime in RUNTIMES.items():
            group = [m for m in made if m[0] == net and m[4] == fmt]
            for n_threads in threads:
                if not group:
                    continue
                log(f"speed {net} {runtime} {n_threads} thread(s): {len(group)} artifacts")
                timed, error = probe("latency", [m[5] for m in group], "--threads", str(n_threads),
                                     "--rounds", str(rounds), "--runs", str(runs_per_round))
                if error:
                    errors.append(f"{net} {runtime} threads={n_threads}: {error}")
                for m in group:
                    result = (timed or {}).get(m[5], {"error": error})
                    rows.append({"net": net, "runtime": runtime, "threads": n_threads,
                                 "framework": m[1], "side": m[2], "recipe": m[3], "format": fmt,
                                 "path": m[5], **result})
    return {"rows": rows, "speedups": speedups(rows), "runs": runs, "errors": errors}


def speedups(rows: list[dict]) -> list[dict]:
    """fp32 p50 / int8 p50 for each (net, runtime, threads, framework, side) that has both."""
    out = []
    keys = dict.fromkeys((r["net"], r["runtime"], r["threads"], r["framework"], r["side"]) for r in rows)
    for net, runtime, threads, framework, side in keys:
        p50 = {r["recipe"]: r.get("p50_ms") for r in rows
               if (r["net"], r["runtime"], r["threads"], r["framework"], r["side"])
               == (net, runtime, threads, framework, side)}
        base_int8 = next((r.get("p50_ms") for r in rows if side == "toolkit" and r["side"] == "baseline"
                          and (r["net"], r["runtime"], r["threads"], r["framework"], r["recipe"])
                          == (net, runtime, threads, framework, "int8")), None)
        out.append({"net": net, "runtime": runtime, "threads": threads, "framework": framework,
                    "side": side, "fp32_p50_ms": p50.get("fp32"), "int8_p50_ms": p50.get("int8"),
                    "int8_speedup": ratio(p50.get("fp32"), p50.get("int8"), 3),
                    "int8_vs_baseline_int8": ratio(p50.get("int8"), base_int8, 3)})
    return out


def section(speed: dict, results: dict) -> list[str]:
    cpu = results.get("meta", {}).get("cpu", {})
    rows = [[s["net"], s["runtime"], s["threads"], s["framework"], s["side"], s["fp32_p50_ms"],
             s["int8_p50_ms"], s["int8_speedup"], s["int8_vs_baseline_int8"]]
            for s in speed.get("speedups", [])]
    slower = [f"{s['net']} {s['runtime']} {s['threads']}t from {s['framework']} ({s['side']}, "
              f"{s['int8_speedup']}x)" for s in speed.get("speedups", [])
              if s["int8_speedup"] is not None and s["int8_speedup"] < 1.0]
    intro = ("conv32: 32x32x3 input, conv 64/128/128, untrained, random inputs, int8 calibrated on "
             "256 random samples. conv1m: the 1.2M-parameter digits net. `origin` is the framework "
             "the artifact was made from (Keras .onnx: the toolkit's TFLite->ONNX route; PyTorch "
             ".tflite: litert-torch). Each (net, runtime, threads) is one fresh process timing all "
             "its artifacts round-robin; value = median of per-round p50s.")
    notes = [(f"- CPU: {cpu.get('model', '?')}; SIMD flags that matter for int8: "
             f"{', '.join(cpu.get('simd_flags', [])) or '?'} (no VNNI: no int8 dot-product "
             "instructions)"),
             "- int8 slower than fp32: " + ("; ".join(slower) or "none"), ""]
    return (["## 3. Speed (batch 1, p50 ms)", "", intro, ""]
            + table(["net", "runtime", "threads", "origin", "side", "fp32", "int8", "int8 speedup",
                     "int8 / baseline int8"], rows) + notes)


def _run(ctx: RunContext) -> dict:
    size_rows = case_results(ctx.results, "size").get("rows", [])
    return run(ctx.models, size_rows, ctx.log, torch_form=ctx.torch_form, **ctx.timing())


# No targets since the zoo case replaced int8_speedup_* (int8 dot products this CPU lacks).
CASE = Case(name="speed", run=_run, targets=no_targets, why_missed=no_reason, section=section,
            uses_models=("keras", "torch"))

"""Case `channels`: what structured (channel) pruning buys in latency, in both runtimes.

For a ResNet-style and a MobileNetV2-style net (bench/channel_nets.py, 32x32x3, untrained,
random inputs labelled by the float model) in each framework, the toolkit makes fp32
(no steps), channels50, int8_qat and int8_channels50 artifacts in the framework's own format
(Keras: .tflite timed in LiteRT, PyTorch: .onnx in onnxruntime, so each runtime sees both
nets); one probe process per runtime then times them round-robin at batch 1, 1 thread.
The pruned / QAT recipes run with 1 fine-tuning epoch (bench/recipes/*_1epoch.yaml, same
steps otherwise): latency depends on the architecture, not on the weights, and the labels
are random.
Speedups are pruned p50 / unpruned p50 (fp32: channels50 / fp32; int8: int8_channels50 /
int8_qat): below 1 is faster. Params and MACs come from the reports (read from the files).
"""
from __future__ import annotations

import json

from bench.case import Case, RunContext, case_results, no_reason, target
from bench.markdown import table
from bench.measure import python_cmd, ratio, run_process
from bench.sides import ARTIFACTS, BUILD, probe, run_toolkit

RECIPES = ("fp32", "channels50", "int8_qat", "int8_channels50")
PAIRS = {"channels50_speedup": ("channels50", "fp32"),
         "int8_channels50_speedup": ("int8_channels50", "int8_qat")}
RUNTIMES = {"tflite": "LiteRT", "onnx": "onnxruntime"}
FRAMEWORKS = ("keras", "torch")
FORMAT = {"keras": "tflite", "torch": "onnx"}   # each framework's own export, one runtime each
SHORT = {"channels50", "int8_qat", "int8_channels50"}   # bench/recipes/<name>_1epoch.yaml
MODELS = BUILD / "channel_models"
RANDOM_TRAIN, RANDOM_VAL = 256, 64

PREPARE = """
import sys, json, numpy as np
from pathlib import Path
from bench import channel_nets as cn
framework, out = sys.argv[1], Path(sys.argv[2]); out.mkdir(parents=True, exist_ok=True)
n_train, n_val = int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(0)
x = rng.random((n_train + n_val, cn.INPUT_HW, cn.INPUT_HW, cn.IN_CHANNELS), dtype=np.float32)
entries = {}
for name in cn.NET_NAMES:
    if framework == "keras":
        model = cn.build_keras(name); path = out / f"{name}.keras"; model.save(path)
        xs = x; predict = lambda a: model.predict(a, verbose=0)
        entries[name] = {"model": str(path)}
    else:
        import torch
        model = cn.build_torch(name).eval(); path = out / f"{name}.pt"
        torch.save(model.state_dict(), path); xs = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
        predict = lambda a: model(torch.from_numpy(a)).detach().numpy()
        entries[name] = {"function": f"bench.channel_nets:torch_{name}", "weights": str(path)}
    y = np.argmax(predict(xs), 1).astype(np.int64)
    data = out / f"{name}_{framework}.npz"
    np.savez(data, x_train=xs[:n_train], y_train=y[:n_train], x_val=xs[n_train:], y_val=y[n_train:])
    entries[name]["data"] = str(data)
print(json.dumps(entries))
"""


def prepare(framework: str) -> dict:
    proc = run_process(python_cmd("-c", PREPARE, framework, MODELS / framework, RANDOM_TRAIN,
                                  RANDOM_VAL), timeout=900)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(log, frameworks=FRAMEWORKS, rounds: int = 5, runs_per_round: int = 100) -> dict:
    made, runs, errors = [], [], []
    for framework in frameworks:
        log(f"channels: preparing {framework} nets")
        try:
            entries = prepare(framework)
        except (ValueError, IndexError) as exc:
            errors.append(f"prepare {framework}: {exc}")
            continue
        for net, entry in entries.items():
            for recipe in RECIPES:
                log(f"channels {net}/{framework}: toolkit {recipe}")
                form = "function" if framework == "torch" else "pt2"
                tk = run_toolkit(framework, entry,
                                 f"{recipe}_1epoch" if recipe in SHORT else recipe, entry["data"],
                                 ARTIFACTS / "channels" / f"{net}_{framework}" / recipe,
                                 formats=FORMAT[framework], torch_form=form)
                runs.append({"net": net, "framework": framework, "recipe": recipe, **tk.summary()})
                if tk.error:
                    errors.append(f"{net}/{framework} {recipe}: {tk.error}")
                for art in (tk.report or {}).get("artifacts", []):
                    made.append({"net": net, "framework": framework, "recipe": recipe,
                                 "format": art["format"], "path": tk.artifacts[art["format"]],
                                 "params": art.get("params"), "macs": art.get("macs"),
                                 "metric_value": art.get("metric_value")})
    rows = []
    for fmt, runtime in RUNTIMES.items():
        group = [m for m in made if m["format"] == fmt]
        if not group:
            continue
        log(f"channels: timing {len(group)} artifacts in {runtime}, 1 thread")
        timed, error = probe("latency", [m["path"] for m in group], "--threads", "1",
                             "--rounds", str(rounds), "--runs", str(runs_per_round))
        if error:
            errors.append(f"{runtime}: {error}")
        for m in group:
            rows.append({**m, "runtime": runtime, **(timed or {}).get(m["path"], {"error": error})})
    return {"rows": rows, "speedups": speedups(rows), "runs": runs, "errors": errors}


def speedups(rows: list[dict]) -> list[dict]:
    """Per (net, framework, runtime): pruned p50 / unpruned p50 and MACs ratios, per pair."""
    out = []
    for key in dict.fromkeys((r["net"], r["framework"], r["runtime"]) for r in rows):
        by_recipe = {r["recipe"]: r for r in rows if (r["net"], r["framework"], r["runtime"]) == key}
        entry = {"net": key[0], "framework": key[1], "runtime": key[2]}
        for name, (pruned, unpruned) in PAIRS.items():
            a, b = by_recipe.get(pruned, {}), by_recipe.get(unpruned, {})
            entry[name] = ratio(a.get("p50_ms"), b.get("p50_ms"), 3)
            entry[name.replace("speedup", "macs_ratio")] = ratio(a.get("macs"), b.get("macs"), 3)
            entry[f"{pruned}_p50_ms"], entry[f"{unpruned}_p50_ms"] = a.get("p50_ms"), b.get("p50_ms")
        out.append(entry)
    return out


def targets(results: dict) -> dict:
    """channels50_speedup / int8_channels50_speedup: the worst (largest) ratio over nets,
    frameworks and runtimes; goal <= 0.6."""
    out = {}
    rows = case_results(results, "channels").get("speedups", [])
    for name, (pruned, unpruned) in PAIRS.items():
        values = [(r[name], f"{r['net']}/{r['framework']} {r['runtime']}") for r in rows
                  if r.get(name) is not None]
        value, where = max(values) if values else (None, "not measured")
        expected = len(FRAMEWORKS) * 2   # nets x frameworks, one runtime each
        out[name] = target(value, 0.6, "<=", f"p50 {pruned} / p50 {unpruned}, batch 1, 1 thread, "
                           "LiteRT and onnxruntime, ResNet- and MobileNetV2-style nets",
                           f"worst: {where}; {len(values)}/{expected} measured",
                           force_miss=len(values) < expected)
    return out


def section(channels: dict, results: dict) -> list[str]:
    rows = [[r["net"], r["framework"], r["runtime"], r.get("fp32_p50_ms"), r.get("channels50_p50_ms"),
             r.get("channels50_speedup"), r.get("channels50_macs_ratio"), r.get("int8_qat_p50_ms"),
             r.get("int8_channels50_p50_ms"), r.get("int8_channels50_speedup"),
             r.get("int8_channels50_macs_ratio")]
            for r in channels.get("speedups", [])]
    intro = ("32x32x3 ResNet- and MobileNetV2-style nets (bench/channel_nets.py), untrained; "
             "batch 1, 1 thread, p50 ms; speedup = pruned p50 / unpruned p50 (lower is faster). "
             "int8_channels50 aligns the kept widths to 16 (`channel_multiple: 16`), so its MACs "
             "ratio can differ from channels50's.")
    return (["## 6. Channel pruning (channels50, int8_channels50)", "", intro, ""]
            + table(["net", "framework", "runtime", "fp32", "channels50", "ratio", "MACs ratio",
                     "int8_qat", "int8_channels50", "ratio", "MACs ratio"], rows) + [""])


def _run(ctx: RunContext) -> dict:
    return run(ctx.log, **ctx.timing())


CASE = Case(name="channels", run=_run, targets=targets, why_missed=no_reason, section=section)

"""bench/RESULTS.md from the results dict: targets first, then one table per case."""
from __future__ import annotations

from bench import case_finetune
from bench.explain import why_missed


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _r4(value) -> str | None:
    """Size ratios to 4 places: the targets sit at 0.255 / 0.27 / 0.20."""
    return None if value is None else f"{value:.4f}"


def _table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
    return lines + [""]


def _dtypes(row: dict) -> str:
    dtypes = row.get("weight_dtypes") or {}
    top = ", ".join(f"{k} {v:.0%}" for k, v in list(dtypes.items())[:2])
    return f"{top}; {row.get('sparsity', 0):.0%} zeros" if dtypes else "—"


def targets_section(results: dict) -> list[str]:
    rows = []
    for name, t in results.get("targets", {}).items():
        reason = "" if t["met"] else t.get("why") or why_missed(name, t, results)
        rows.append([f"`{name}`", t["what"], t["value"], t["goal"], t["met"],
                     t["note"] + (f". **Why missed:** {reason}" if reason else "")])
    return ["## Targets", ""] + _table(["target", "what", "value", "goal", "met", "notes"], rows)


def size_section(size: dict) -> list[str]:
    rows = []
    for r in size.get("rows", []):
        if r["side"] != "toolkit":
            continue
        rows.append([f"{r['net']}/{r['framework']}", r["recipe"], r["format"], r.get("size_bytes"),
                     r.get("gzip_bytes"), _r4(r.get("ratio_fp32")), _r4(r.get("gzip_ratio_fp32")),
                     _r4(r.get("ratio_baseline")), _r4(r.get("gzip_ratio_baseline")), r.get("accuracy"),
                     r.get("baseline_accuracy"), _dtypes(r) if "error" not in r else r["error"][:80]])
    base = [[f"{r['net']}/{r['framework']}", r["recipe"], r["format"], r.get("size_bytes"),
             r.get("gzip_bytes"), _r4(r.get("ratio_fp32")), _r4(r.get("gzip_ratio_fp32")), r.get("accuracy"),
             _dtypes(r) if "error" not in r else r["error"][:80]]
            for r in size.get("rows", []) if r["side"] == "baseline"]
    return (["## 1-2. Size and accuracy", "",
             ("Toolkit artifacts (`compress --recipe R`, both formats). `x fp32` is against the "
             "same side's fp32 artifact of the same format; `x base` against the hand-written "
             "baseline's artifact of the same recipe and format (Keras baseline: .tflite, PyTorch "
             "baseline: .onnx). Accuracy: digits val split (450), each artifact in its runtime "
             "(LiteRT / onnxruntime), same evaluation code for both sides. Int8 weights' physical "
             "limit is 0.25x fp32."), ""]
            + _table(["net", "recipe", "fmt", "raw B", "gzip B", "x fp32 raw", "x fp32 gzip",
                      "x base raw", "x base gzip", "acc", "base acc", "weights"], rows)
            + ["Baseline artifacts:", ""]
            + _table(["net", "recipe", "fmt", "raw B", "gzip B", "x fp32 raw", "x fp32 gzip", "acc",
                      "weights"], base))


def speed_section(speed: dict, cpu: dict) -> list[str]:
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
            + _table(["net", "runtime", "threads", "origin", "side", "fp32", "int8", "int8 speedup",
                      "int8 / baseline int8"], rows) + notes)


def zoo_section(zoo: dict, cpu: dict) -> list[str]:
    rows = [[r["net"], r["framework"], r["runtime"], r["fp32_p50_ms"], r["int8_p50_ms"],
             r["vendor_int8_p50_ms"], r["int8_vs_fp32"], r["int8_vs_vendor"], r["int8_accuracy"],
             r["vendor_accuracy"]] for r in zoo.get("ratios", [])]
    intro = ("ResNet-18-, MobileNetV2- and EfficientNet-B0-style nets, 64x64x3, random init "
             "with BatchNorm statistics from the data (bench/zoo_nets.py, zoo_build.py); toolkit "
             "`int8` recipe vs toolkit fp32 vs the vendor tool's int8 (onnxruntime "
             "quantize_static QDQ per-channel on the toolkit's fp32 ONNX; TFLiteConverter full "
             "int8 on the Keras model; both calibrated on the toolkit's 256 calibration images). "
             "Batch 1, 1 thread, one process per runtime timing all its "
             "artifacts round-robin. Accuracy = top-1 agreement with the float model (256 "
             "images).")
    note = (f"- CPU int8 features: {', '.join(cpu.get('simd_flags', [])) or '?'}; no VNNI / AMX "
            "int8 dot products, so int8 convs run on AVX2 (u8 x s8 pairs summed in 16 bits), "
            "about 1.5-2.5x float throughput, and element-wise int8 ops (sigmoid, multiply) are "
            "no faster than float.")
    settings = ("- Toolkit int8 ONNX: 7-bit weights (onnxruntime `reduce_range`, against the "
                "16-bit pair-sum saturation of u8 x s8 on AVX2) and spatial ReduceMean rewritten "
                "as GlobalAveragePool (an int8 kernel); the vendor file is onnxruntime's defaults.")
    litert = ("- LiteRT int8 runs in XNNPACK's QS8/QC8 kernels, which on AVX2 without VNNI do not "
              "beat its float kernels on MobileNet-style layers (measured, single-op files, int8 "
              "I/O: 3-channel stem conv 2.2x float, 16->96 1x1 conv 1.2-1.4x, 3x3 depthwise "
              "0.6-0.8x); the converter's own file is as slow, per-tensor weights and XNNPACK's "
              "latest-features flag change it by under 3%.")
    misses = [f"{r['net']}/{r['framework']} {r['runtime']} {r['int8_vs_fp32']}"
              for r in zoo.get("ratios", []) if (r["int8_vs_fp32"] or 9) > 0.9]
    settings += "\n- int8 / fp32 above 0.9: " + ("; ".join(misses) or "none")
    run = zoo.get("run")
    if run:
        intro += (f" Run separately from the other cases: commit {run.get('commit')}, "
                  f"{run.get('started')}, {_fmt(run.get('wall_s'), 0)} s, load average "
                  f"{run.get('loadavg_start')} -> {run.get('loadavg_end')}.")
    return (["## 6. Zoo (batch 1, p50 ms, 1 thread)", "", intro, ""]
            + _table(["net", "origin", "runtime", "fp32", "int8", "vendor int8", "int8 / fp32",
                      "int8 / vendor", "acc", "vendor acc"], rows) + [note, litert, settings, ""])


def transformer_section(case: dict) -> list[str]:
    rows = [[r["model"], f"{r['side']} {r['recipe']}", r.get("size_bytes"), r.get("p50_ms"),
             (r.get("cosine") or {}).get("last_hidden_state"),
             (r.get("cosine") or {}).get("pooler_output"), r.get("error", "")[:80]]
            for r in case.get("rows", [])]
    models = case.get("models", {})
    trained = next((m["training"] for m in models.values() if "training" in m), {})
    picked = next((m.get("toolkit_int8_report", {}).get("quantize") for m in models.values()), None)
    intro = ("Hugging Face BertModel from a BertConfig (int64 input_ids + attention_mask, seq "
             "32): bert6x384 = 6 layers, 384 wide, 30522-token vocabulary, random init (size, "
             "speed); bert2x64 = 2 layers, 64 wide, trained in the bench for a few seconds on a "
             "synthetic token task (fidelity). Toolkit `int8` (Python API, `validate: {metric: "
             "fidelity}`) vs toolkit fp32 vs onnxruntime `quantize_dynamic(per_channel=True, "
             "weight_type=QInt8)` on the toolkit's fp32 ONNX. p50: batch 1, 1 thread, the three "
             "artifacts round-robin in one process. Cosine: mean per row vs the float PyTorch "
             "model, 64 rows.")
    notes = [f"- int8 mode the toolkit picked: {(picked or {}).get('mode', '?')}; bert2x64 "
             f"training: {trained or '?'}", ""]
    return (["## 6. Transformer (BERT-style encoder, onnxruntime)", "", intro, ""]
            + _table(["model", "artifact", "raw B", "p50 ms", "cos last_hidden_state",
                      "cos pooler_output", "error"], rows) + notes)


def overhead_section(overhead: dict) -> list[str]:
    rows = [[f"{r['net']}/{r['framework']}", r["format"], r["repeats"], r["toolkit_wall_s"],
             r["baseline_wall_s"], r["wall_ratio"], r.get("toolkit_cpu_s"), r.get("baseline_cpu_s"),
             r.get("cpu_ratio"), r["toolkit_peak_rss_mb"], r["baseline_peak_rss_mb"], r["rss_ratio"]]
            for r in overhead.get("rows", [])]
    start = overhead.get("startup", {})
    intro = ("Toolkit: `compress --recipe int8_prune30 MODEL --data digits --format F` (F = the "
             "baseline's format), which also evaluates the original model and the artifact and "
             "writes the report. Baseline: its script with `--evaluate`. Runs alternate A B, B A, "
             "A B; medians. CPU = user + system seconds of the process tree.")
    notes = [(f"- `compress --help`: {_fmt(start.get('help_wall_s'))} s wall (median of "
             f"{start.get('repeats')}; a bare `python -c pass` takes "
             f"{_fmt(start.get('python_startup_wall_s'))} s), peak RSS "
             f"{_fmt(start.get('help_peak_rss_mb'), 1)} MB"),
             (f"- `import compressor`: {_fmt(start.get('import_in_process_s'), 4)} s in-process "
             f"({_fmt(start.get('import_process_wall_s'))} s for the whole `python -c` process)"), ""]
    return (["## 4. Overhead (whole process, int8_prune30: prune 2 epochs + QAT 2 epochs)", "",
             intro, ""]
            + _table(["net", "artifact", "runs", "toolkit wall s", "baseline wall s", "wall ratio",
                      "toolkit CPU s", "baseline CPU s", "CPU ratio", "toolkit RSS MB",
                      "baseline RSS MB", "RSS ratio"], rows) + notes)


def scaling_section(scaling: dict) -> list[str]:
    rows = [[r["net"], r["params"], r["toolkit_wall_s"], r.get("toolkit_cpu_s"), r["toolkit_peak_rss_mb"],
             r["baseline_wall_s"], r.get("baseline_cpu_s"), r["baseline_peak_rss_mb"], r["wall_ratio"]]
            for r in scaling.get("rows", [])]
    g = scaling.get("growth", {})
    intro = ("Untrained Keras conv nets of one family on digits input; baseline = its int8 "
             "PTQ .tflite script with evaluation.")
    notes = [(f"- log-log slope vs parameters, whole cost: wall {_fmt(g.get('toolkit_wall_slope'))}, "
             f"CPU {_fmt(g.get('toolkit_cpu_slope'))}, peak RSS {_fmt(g.get('toolkit_rss_slope'))} "
             f"(baseline wall {_fmt(g.get('baseline_wall_slope'))})"),
             (f"- cost above the 0.1M net vs parameters added: wall "
             f"{_fmt(g.get('toolkit_marginal_wall_slope'))}, CPU "
             f"{_fmt(g.get('toolkit_marginal_cpu_slope'))}, peak RSS "
             f"{_fmt(g.get('toolkit_marginal_rss_slope'))} (1.0 = linear)"), ""]
    return (["## 5. Scaling (`compress --recipe int8`, PTQ, both formats, validated)", "", intro, ""]
            + _table(["net", "params", "toolkit wall s", "toolkit CPU s", "toolkit RSS MB",
                      "baseline wall s", "baseline CPU s", "baseline RSS MB", "wall ratio"], rows)
            + notes)


def channels_section(case: dict) -> list[str]:
    rows = [[r["net"], r["framework"], r["runtime"], r.get("fp32_p50_ms"), r.get("channels50_p50_ms"),
             r.get("channels50_speedup"), r.get("channels50_macs_ratio"), r.get("int8_qat_p50_ms"),
             r.get("int8_channels50_p50_ms"), r.get("int8_channels50_speedup"),
             r.get("int8_channels50_macs_ratio")]
            for r in case.get("speedups", [])]
    intro = ("32x32x3 ResNet- and MobileNetV2-style nets (bench/channel_nets.py), untrained; "
             "batch 1, 1 thread, p50 ms; speedup = pruned p50 / unpruned p50 (lower is faster). "
             "int8_channels50 aligns the kept widths to 16 (`channel_multiple: 16`), so its MACs "
             "ratio can differ from channels50's.")
    return (["## 6. Channel pruning (channels50, int8_channels50)", "", intro, ""]
            + _table(["net", "framework", "runtime", "fp32", "channels50", "ratio", "MACs ratio",
                      "int8_qat", "int8_channels50", "ratio", "MACs ratio"], rows) + [""])


def sweep_section(case: dict) -> list[str]:
    rows = [[", ".join(r["recipes"]), r["workers"], r.get("serial_wall_s"), r.get("ray_wall_s"),
             r.get("ray_speedup"), r.get("same_rows")] for r in case.get("rows", [])]
    run = case.get("run") or {}
    when = (f" Measured {run.get('started')} (commit {run.get('commit')}), load average "
            f"{run.get('loadavg_start')} at start, {run.get('loadavg_end')} at end."
            if run else "")
    return (["## 8. Sweep on Ray (`compress sweep --executor ray`, local Ray, Keras digits)", "",
             "Wall time of the whole command; Ray's includes starting it and workers' imports."
             + when, ""]
            + _table(["recipes", "Ray CPUs", "serial wall s", "Ray wall s", "speed-up",
                      "same rows"], rows) + [""])


def render(results: dict) -> str:
    meta = results.get("meta", {})
    cpu = meta.get("cpu", {})
    summary = (f"`make bench` (`python -m bench.run`) on {meta.get('cpus')} CPU(s) "
               f"({cpu.get('model', '?')}), {meta.get('started')}; total "
               f"{_fmt(meta.get('wall_s'), 0)} s (of which {_fmt(meta.get('prepare_s'), 0)} s building "
               f"the models, cached in build/bench/models); {_fmt(meta.get('children_cpu_s'), 0)} CPU-seconds "
               f"in child processes; load average at start {meta.get('loadavg_start')}, "
               f"at end {meta.get('loadavg_end')} (other people's jobs share this machine). Commit "
               f"{meta.get('commit')}"
               + (f" (targets recomputed at {meta['rendered_commit']})" if meta.get("rendered_commit") else "")
               + ". Every number is in `bench/results.json`; ratios are the point.")
    lines = ["# compressor benchmark", "", summary, ""]
    lines += targets_section(results)
    cases = results.get("cases", {})
    sections = {"size": size_section, "speed": lambda case: speed_section(case, cpu),
                "overhead": overhead_section, "scaling": scaling_section,
                "zoo": lambda case: zoo_section(case, cpu), "channels": channels_section,
                "transformer": transformer_section, "sweep": sweep_section,
                "kd_gain": lambda case: case_finetune.kd_gain_section(case, _table),
                "pretrained_drop": lambda case: case_finetune.pretrained_drop_section(case, _table)}
    for key, section in sections.items():
        if key in cases:
            lines += section(cases[key])
    errors = [e for case in cases.values() for e in case.get("errors", [])]
    lines += ["## Errors", ""] + ([f"- {e}" for e in errors] or ["none"]) + [""]
    return "\n".join(lines)

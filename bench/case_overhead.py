"""Case 4: what the toolkit costs over a hand-written script, and its start-up time.

`compress --recipe int8_prune30` on the digits nets vs the baseline script doing the same
epochs on the same data and making the same artifact (Keras: .tflite, PyTorch: .onnx, each
evaluated on the val split), whole process, run A B, B A, A B; medians of wall time, CPU time and peak RSS.
Also `compress --help` wall time and `import compressor` time.
"""
from __future__ import annotations

import json

from bench.case import Case, RunContext, case_results, not_measured, target
from bench.markdown import fmt, table
from bench.measure import (
    compress_cmd,
    error_line,
    median,
    python_cmd,
    ratio,
    run_process,
)
from bench.sides import ARTIFACTS, BASELINE_FORMAT, run_baseline, run_toolkit

NETS = (("digits", "keras"), ("digits", "torch"))
IMPORT_SNIPPET = ("import time; t = time.perf_counter(); import compressor; "
                  "print(time.perf_counter() - t)")


def _one_run(side: str, framework: str, entry: dict, where, torch_form: str):
    fmt = BASELINE_FORMAT[framework]
    if side == "toolkit":
        return run_toolkit(framework, entry, "int8_prune30", "digits", where / "toolkit",
                           formats=fmt, torch_form=torch_form)
    return run_baseline(framework, entry, ["int8_prune30"], "digits", where / "baseline",
                        evaluate=True)


def compare(models: dict, log, repeats: int, torch_form: str, nets=NETS) -> tuple[list, list]:
    rows, errors = [], []
    for net, framework in nets:
        entry = models.get(framework, {}).get(net)
        if entry is None:
            errors.append(f"{net}/{framework}: model was not prepared")
            continue
        where = ARTIFACTS / "overhead" / f"{net}_{framework}"
        runs = {"toolkit": [], "baseline": []}
        for i in range(repeats):   # A B, B A, A B, ...: neither side always runs first
            for side in ("toolkit", "baseline") if i % 2 == 0 else ("baseline", "toolkit"):
                log(f"overhead {net}/{framework}: {side} int8_prune30 ({i + 1}/{repeats})")
                done = _one_run(side, framework, entry, where, torch_form)
                runs[side].append(done.summary())
                if done.error:
                    errors.append(f"{net}/{framework} {side}: {done.error}")
        row = {"net": net, "framework": framework, "format": BASELINE_FORMAT[framework],
               "repeats": repeats, "toolkit_runs": runs["toolkit"], "baseline_runs": runs["baseline"]}
        for side, side_runs in runs.items():
            ok = [r for r in side_runs if "error" not in r]
            row[f"{side}_ok_runs"] = len(ok)
            row[f"{side}_wall_s"] = median(r["process"]["wall_s"] for r in ok)
            row[f"{side}_cpu_s"] = median(r["process"]["cpu_s"] for r in ok)
            row[f"{side}_peak_rss_mb"] = median(r["process"]["peak_rss_mb"] for r in ok)
        row["wall_ratio"] = ratio(row["toolkit_wall_s"], row["baseline_wall_s"], 3)
        row["cpu_ratio"] = ratio(row["toolkit_cpu_s"], row["baseline_cpu_s"], 3)
        row["rss_ratio"] = ratio(row["toolkit_peak_rss_mb"], row["baseline_peak_rss_mb"], 3)
        rows.append(row)
    return rows, errors


def startup(repeats: int) -> tuple[dict, list]:
    errors = []
    help_runs = [run_process(compress_cmd("--help"), timeout=60) for _ in range(repeats)]
    python_runs = [run_process(python_cmd("-c", "pass"), timeout=60) for _ in range(repeats)]
    import_runs = [run_process(python_cmd("-c", IMPORT_SNIPPET), timeout=60) for _ in range(repeats)]
    for name, runs in (("compress --help", help_runs), ("import compressor", import_runs)):
        errors += [f"{name}: exited {r.returncode}: {error_line(r.stderr_tail)}" for r in runs if not r.ok]
    in_process = []
    for r in import_runs:
        try:
            in_process.append(float(json.loads(r.stdout.strip().splitlines()[-1])))
        except (ValueError, IndexError):
            pass
    result = {
        "repeats": repeats,
        "help_wall_s": median(r.wall_s for r in help_runs if r.ok),
        "help_peak_rss_mb": median(r.peak_rss_mb for r in help_runs if r.ok),
        "python_startup_wall_s": median(r.wall_s for r in python_runs if r.ok),
        "import_in_process_s": median(in_process),
        "import_process_wall_s": median(r.wall_s for r in import_runs if r.ok),
        "help_wall_all_s": [round(r.wall_s, 3) for r in help_runs],
    }
    return result, errors


def run(models: dict, log, repeats: int = 3, torch_form: str = "pt2", nets=NETS) -> dict:
    log("overhead: compress --help and import compressor")
    start, errors = startup(repeats=max(5, repeats))
    rows, more = compare(models, log, repeats, torch_form, nets)
    return {"rows": rows, "startup": start, "errors": errors + more}


def targets(results: dict) -> dict:
    overhead = case_results(results, "overhead")
    rows = overhead.get("rows", [])
    values = [(r["wall_ratio"], f"{r['net']}/{r['framework']}") for r in rows if r.get("wall_ratio")]
    value, where = max(values) if values else (None, "")
    failed = [f"{r['net']}/{r['framework']}" for r in rows if not r.get("wall_ratio")]
    note = (f"worst: {where}" if values else "not measured") + (f"; failed: {failed}" if failed else "")
    start = overhead.get("startup", {})
    return {
        "toolkit_wall_vs_baseline": target(
            value, 1.10, "<=", "whole-process wall time, compress --recipe int8_prune30 / baseline",
            note, force_miss=bool(failed)),
        "help_wall_s": target(start.get("help_wall_s"), 0.5, "<=", "compress --help wall time (s)",
                              "median of fresh processes"),
    }


def why_missed(name: str, target: dict, results: dict) -> str:
    """Start-up against bare Python's; the wall gap against the spread between repeats."""
    overhead = case_results(results, "overhead")
    if name == "help_wall_s":
        start = overhead.get("startup", {})
        return (f"a bare `python -c pass` already takes {start.get('python_startup_wall_s')} s "
                "here; the rest is argparse and the console-script entry point")
    if target["value"] is None:
        return not_measured(results, "overhead")
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


def section(overhead: dict, results: dict) -> list[str]:
    rows = [[f"{r['net']}/{r['framework']}", r["format"], r["repeats"], r["toolkit_wall_s"],
             r["baseline_wall_s"], r["wall_ratio"], r.get("toolkit_cpu_s"), r.get("baseline_cpu_s"),
             r.get("cpu_ratio"), r["toolkit_peak_rss_mb"], r["baseline_peak_rss_mb"], r["rss_ratio"]]
            for r in overhead.get("rows", [])]
    start = overhead.get("startup", {})
    intro = ("Toolkit: `compress --recipe int8_prune30 MODEL --data digits --format F` (F = the "
             "baseline's format), which also evaluates the original model and the artifact and "
             "writes the report. Baseline: its script with `--evaluate`. Runs alternate A B, B A, "
             "A B; medians. CPU = user + system seconds of the process tree.")
    notes = [(f"- `compress --help`: {fmt(start.get('help_wall_s'))} s wall (median of "
             f"{start.get('repeats')}; a bare `python -c pass` takes "
             f"{fmt(start.get('python_startup_wall_s'))} s), peak RSS "
             f"{fmt(start.get('help_peak_rss_mb'), 1)} MB"),
             (f"- `import compressor`: {fmt(start.get('import_in_process_s'), 4)} s in-process "
             f"({fmt(start.get('import_process_wall_s'))} s for the whole `python -c` process)"), ""]
    return (["## 4. Overhead (whole process, int8_prune30: prune 2 epochs + QAT 2 epochs)", "",
             intro, ""]
            + table(["net", "artifact", "runs", "toolkit wall s", "baseline wall s", "wall ratio",
                     "toolkit CPU s", "baseline CPU s", "CPU ratio", "toolkit RSS MB",
                     "baseline RSS MB", "RSS ratio"], rows) + notes)


def _run(ctx: RunContext) -> dict:
    return run(ctx.models, ctx.log, repeats=1 if ctx.quick else 3, torch_form=ctx.torch_form)


CASE = Case(name="overhead", run=_run, targets=targets, why_missed=why_missed, section=section,
            uses_models=("keras", "torch"))

"""Case 4: what the toolkit costs over a hand-written script, and its start-up time.

`compress --recipe int8_prune30` on the digits nets vs the baseline script doing the same
epochs on the same data and making the same artifact (Keras: .tflite, PyTorch: .onnx, each
evaluated on the val split), whole process, run A B, B A, A B; medians of wall time, CPU time and peak RSS.
Also `compress --help` wall time and `import compressor` time.
"""
from __future__ import annotations

import json

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

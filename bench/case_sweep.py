"""Case 8: wall time of a 4-recipe sweep on the Keras digits net, serial vs Ray (2 local CPUs).

`compress sweep --no-latency` into a fresh folder each time (nothing cached), serial then Ray;
the Ray time includes starting and stopping the local Ray and each worker's first imports.
Same rows expected: the case records whether both sweep.csv files agree on sizes and metrics.
"""
from __future__ import annotations

import csv
import shutil

from bench.case import Case, RunContext, no_reason, no_targets
from bench.markdown import table
from bench.measure import compress_cmd, error_line, ratio, run_process
from bench.sides import ARTIFACTS

RECIPES = ("fp16", "int8", "int8_prune30", "prune50")
COMPARED = ("recipe", "format", "size_bytes", "metric_value", "sparsity", "error")


def _rows(folder) -> list[tuple]:
    with open(folder / "sweep.csv", newline="") as handle:
        return [tuple(row[k] for k in COMPARED) for row in csv.DictReader(handle)]


def run(models: dict, log) -> dict:
    entry = models.get("keras", {}).get("digits")
    if entry is None:
        return {"rows": [], "errors": ["digits/keras: model was not prepared"]}
    row, errors, tables = {"recipes": list(RECIPES), "workers": 2}, [], {}
    for executor in ("serial", "ray"):
        out = ARTIFACTS / "sweep" / executor
        shutil.rmtree(out, ignore_errors=True)
        log(f"sweep: {len(RECIPES)} recipes, {executor}")
        done = run_process(compress_cmd("sweep", entry["model"], "--recipes", ",".join(RECIPES),
                                        "--out", out, "--no-latency", "--executor", executor),
                           timeout=1800)
        row[f"{executor}_wall_s"] = round(done.wall_s, 2)
        if not done.ok:
            errors.append(f"sweep {executor} exited {done.returncode}: "
                          f"{error_line(done.stderr_tail)}")
            continue
        tables[executor] = _rows(out)
    row["ray_speedup"] = ratio(row.get("serial_wall_s"), row.get("ray_wall_s"), 2)
    row["same_rows"] = (tables.get("serial") == tables.get("ray")) if len(tables) == 2 else None
    return {"rows": [row], "errors": errors}


def section(sweep: dict, results: dict) -> list[str]:
    rows = [[", ".join(r["recipes"]), r["workers"], r.get("serial_wall_s"), r.get("ray_wall_s"),
             r.get("ray_speedup"), r.get("same_rows")] for r in sweep.get("rows", [])]
    facts = sweep.get("run") or {}   # set when merged in with --into
    when = (f" Measured {facts.get('started')} (commit {facts.get('commit')}), load average "
            f"{facts.get('loadavg_start')} at start, {facts.get('loadavg_end')} at end."
            if facts else "")
    return (["## 8. Sweep on Ray (`compress sweep --executor ray`, local Ray, Keras digits)", "",
             "Wall time of the whole command; Ray's includes starting it and workers' imports."
             + when, ""]
            + table(["recipes", "Ray CPUs", "serial wall s", "Ray wall s", "speed-up",
                     "same rows"], rows) + [""])


def _run(ctx: RunContext) -> dict:
    return run(ctx.models, ctx.log)


CASE = Case(name="sweep", run=_run, targets=no_targets, why_missed=no_reason, section=section,
            uses_models=("keras",))

"""Case 8: wall time of a 4-recipe sweep on the Keras digits net, serial vs Ray (2 local CPUs).

`compress sweep --no-latency` into a fresh folder each time (nothing cached), serial then Ray;
the Ray time includes starting and stopping the local Ray and each worker's first imports.
Same rows expected: the case records whether both sweep.csv files agree on sizes and metrics.
"""
from __future__ import annotations

import csv
import shutil

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

"""Case 1 + 2: artifact size (raw, gzip) and accuracy, toolkit vs hand-written baseline.

For each net, the toolkit runs `compress --recipe R` once per recipe (both formats) and the
baseline script makes all four recipes in one process; every artifact is then evaluated on
the digits val split by the same probe code. Sizes are deterministic, so one run each.
"""
from __future__ import annotations

from bench.measure import ratio
from bench.sides import ARTIFACTS, BASELINE_FORMAT, probe, run_baseline, run_toolkit

RECIPES = ("fp32", "fp16", "int8", "int8_prune30")
NETS = (("digits", "keras"), ("digits", "torch"), ("conv1m", "keras"))


def run(models: dict, log, torch_form: str = "pt2", nets=NETS) -> dict:
    rows, runs, errors = [], [], []
    for net, framework in nets:
        entry = models.get(framework, {}).get(net)
        if entry is None:
            errors.append(f"{net}/{framework}: model was not prepared")
            continue
        where = ARTIFACTS / "size" / f"{net}_{framework}"
        made = []   # (recipe, side, format, path)
        for index, recipe in enumerate(RECIPES):
            log(f"size {net}/{framework}: toolkit {recipe}")
            tk = run_toolkit(framework, entry, recipe, "digits", where / f"toolkit_{recipe}",
                             torch_form=torch_form)
            runs.append({"net": net, "framework": framework, "recipe": recipe, **tk.summary()})
            if tk.error:
                errors.append(f"{net}/{framework} toolkit {recipe}: {tk.error}")
            made += [(recipe, "toolkit", fmt, path) for fmt, path in tk.artifacts.items()]
            if index == 0:   # A B order: the baseline's one process runs after the first toolkit run
                log(f"size {net}/{framework}: baseline {','.join(RECIPES)}")
                base = run_baseline(framework, entry, list(RECIPES), "digits", where / "baseline")
                runs.append({"net": net, "framework": framework, "recipe": ",".join(RECIPES),
                             **base.summary()})
                if base.error:
                    errors.append(f"{net}/{framework} baseline: {base.error}")
                made += [(r, "baseline", BASELINE_FORMAT[framework], p) for r, p in base.artifacts.items()]
        log(f"size {net}/{framework}: evaluating {len(made)} artifacts")
        measured, error = probe("evaluate", [m[3] for m in made], "--data", "digits")
        if error:
            errors.append(f"{net}/{framework} evaluate: {error}")
            measured = [{"path": m[3], "error": error} for m in made]
        for (recipe, side, fmt, _), facts in zip(made, measured):
            rows.append({"net": net, "framework": framework, "recipe": recipe, "side": side,
                         "format": fmt, **facts})
    add_ratios(rows)
    return {"rows": rows, "runs": runs, "errors": errors}


def add_ratios(rows: list[dict]) -> None:
    """ratio_fp32 / gzip_ratio_fp32 (same net, side, format) and ratio_baseline (same recipe)."""
    def find(net, framework, recipe, side, fmt):
        return next((r for r in rows if (r["net"], r["framework"], r["recipe"], r["side"], r["format"])
                     == (net, framework, recipe, side, fmt) and "size_bytes" in r), None)

    for row in rows:
        if "size_bytes" not in row:
            continue
        key = (row["net"], row["framework"])
        fp32 = find(*key, "fp32", row["side"], row["format"])
        row["ratio_fp32"] = ratio(row["size_bytes"], fp32 and fp32["size_bytes"])
        row["gzip_ratio_fp32"] = ratio(row["gzip_bytes"], fp32 and fp32["gzip_bytes"])
        if row["side"] == "toolkit":
            base = find(*key, row["recipe"], "baseline", row["format"])
            row["ratio_baseline"] = ratio(row["size_bytes"], base and base["size_bytes"])
            row["gzip_ratio_baseline"] = ratio(row["gzip_bytes"], base and base["gzip_bytes"])
            row["baseline_accuracy"] = base.get("accuracy") if base else None

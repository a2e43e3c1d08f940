"""Case 1 + 2: artifact size (raw, gzip) and accuracy, toolkit vs hand-written baseline.

For each net, the toolkit runs `compress --recipe R` once per recipe (both formats) and the
baseline script makes all four recipes in one process; every artifact is then evaluated on
the digits val split by the same probe code. Sizes are deterministic, so one run each.
"""
from __future__ import annotations

from bench.case import Case, RunContext, case_results, not_measured, target
from bench.markdown import table
from bench.measure import ratio
from bench.sides import ARTIFACTS, BASELINE_FORMAT, probe, run_baseline, run_toolkit

RECIPES = ("fp32", "fp16", "int8", "int8_prune30")
NETS = (("digits", "keras"), ("digits", "torch"), ("conv1m", "keras"))
BIG_NET = "conv1m"
# name -> (nets, recipe, ratio key, goal, what). Retired (issue 14): int8_size_digits and
# int8_prune30_gzip, where fixed per-file bytes dominate a 38k-parameter net; the scaling
# slope is the whole-cost definition.
# int8_size_1m (issue 28): int8 weights alone are ~0.2504x of the fp32 file (biases stay
# int32 / float), so the raw ratio judged the fixed bytes around them against a bound 0.0046
# above that limit; it now judges those bytes: (int8 file - its weight tensors) / fp32 file.
TARGETS = {"int8_size_1m": ((BIG_NET,), "int8", "beyond_weights_fp32", 0.01,
                            "(int8 artifact raw size - its weight tensors as stored) / fp32 raw "
                            "size, 1M-parameter net (the weights alone are the ~0.25x limit)")}


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


def targets(results: dict) -> dict:
    size = case_results(results, "size")
    rows = [{**r, "beyond_weights_fp32": _beyond_weights(r, size.get("rows", []))}
            for r in size.get("rows", []) if r["side"] == "toolkit"]
    out = {}
    for name, (nets, recipe, key, goal, what) in TARGETS.items():
        chosen = [r for r in rows if r["net"] in nets and r["recipe"] == recipe]
        value, note = _worst(chosen, key, f"{recipe} size ratio")
        limits = [f"{r['net']}/{r['framework']} {r['format']}: weights alone "
                  f"{r['ratio_fp32'] - r['beyond_weights_fp32']:.4f}x, whole file "
                  f"{r['ratio_fp32']:.4f}x" for r in chosen
                  if r.get("beyond_weights_fp32") is not None and r.get("ratio_fp32")]
        note += f" ({'; '.join(limits)})" if limits else ""
        missing = _missing_artifacts(size, nets, recipe)
        out[name] = target(value, goal, "<=", what, note + (f"; missing: {missing}" if missing else ""),
                           force_miss=bool(missing))
    return out


def _beyond_weights(row: dict, rows: list[dict]) -> float | None:
    """The artifact's bytes other than its weight tensors (scales, zero points, graph, names,
    metadata), over the same side's fp32 artifact of the same format."""
    fp32 = _row(rows, row, row["side"], "fp32")
    if not fp32 or not row.get("weight_bytes") or "size_bytes" not in row:
        return None
    return ratio(row["size_bytes"] - row["weight_bytes"], fp32["size_bytes"], 4)


def _worst(rows: list[dict], key: str, what: str) -> tuple[float | None, str]:
    values = [(r[key], f"{r['net']}/{r['framework']} {r['format']}") for r in rows
              if r.get(key) is not None]
    if not values:
        return None, f"no {what} measured"
    value, where = max(values)
    return value, f"worst: {where}"


def _missing_artifacts(size: dict, nets, recipe: str) -> str:
    errors = [e for e in size.get("errors", []) if any(e.startswith(n + "/") for n in nets)
              and recipe in e and "toolkit" in e]
    return "; ".join(e[:200] for e in errors)


def why_missed(name: str, target: dict, results: dict) -> str:
    """Each artifact over the goal next to the hand-written baseline's, and what its bytes are."""
    if target["value"] is None:
        return not_measured(results, "size")
    nets, recipe, key, goal, _ = TARGETS[name]
    stored = results["cases"]["size"]["rows"]
    rows = [{**r, "beyond_weights_fp32": _beyond_weights(r, stored)} for r in stored]
    parts = []
    for r in rows:
        if not (r["side"] == "toolkit" and r["recipe"] == recipe and r["net"] in nets
                and (r.get(key) or 0) > goal):
            continue
        base = _row(rows, r, "baseline", recipe)
        text = f"{r['net']}/{r['framework']} {r['format']} {r[key]:.4f}" + (
            f" (hand-written baseline {base[key]:.4f})" if base else " (no baseline in this format)")
        fp32 = _row(rows, r, "toolkit", "fp32")
        if fp32 and r.get("weight_bytes"):
            other = r["size_bytes"] - r["weight_bytes"]
            text += (f": its weight tensors alone (as stored) are "
                     f"{r['weight_bytes'] / fp32['size_bytes']:.4f}x, the other {other:,} B "
                     "(quantization scales and zero points, graph, tensor names, metadata) add "
                     f"{other / fp32['size_bytes']:.4f}x")
        parts.append(text)
    tail = (" gzip finds little to squeeze in int8 values beyond the 30% zeros." if "gzip" in key
            else " Int8 weights alone sit at ~0.25x, so the bytes around them decide it.")
    return "; ".join(parts) + "." + tail


def _row(rows: list[dict], like: dict, side: str, recipe: str) -> dict | None:
    return next((b for b in rows if b["side"] == side and b["recipe"] == recipe
                 and b["net"] == like["net"] and b["framework"] == like["framework"]
                 and b["format"] == like["format"] and "size_bytes" in b), None)


def section(size: dict, results: dict) -> list[str]:
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
            + table(["net", "recipe", "fmt", "raw B", "gzip B", "x fp32 raw", "x fp32 gzip",
                     "x base raw", "x base gzip", "acc", "base acc", "weights"], rows)
            + ["Baseline artifacts:", ""]
            + table(["net", "recipe", "fmt", "raw B", "gzip B", "x fp32 raw", "x fp32 gzip", "acc",
                     "weights"], base))


def _r4(value) -> str | None:
    """Size ratios to 4 places: the target sits at 0.255."""
    return None if value is None else f"{value:.4f}"


def _dtypes(row: dict) -> str:
    dtypes = row.get("weight_dtypes") or {}
    top = ", ".join(f"{k} {v:.0%}" for k, v in list(dtypes.items())[:2])
    return f"{top}; {row.get('sparsity', 0):.0%} zeros" if dtypes else "—"


def _run(ctx: RunContext) -> dict:
    return run(ctx.models, ctx.log, torch_form=ctx.torch_form)


CASE = Case(name="size", run=_run, targets=targets, why_missed=why_missed, section=section,
            uses_models=("keras", "torch"))

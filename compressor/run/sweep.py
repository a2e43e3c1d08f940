"""Accuracy sweeps: many recipes on one model -> a DataFrame and a Pareto plot.

Each recipe's artifacts and report stay under `out_dir/<recipe>/`. A recipe whose report was
made for the same model and the same recipe (both hashed) is not run again, so a sweep that
crashed half-way resumes where it stopped. A recipe that fails does not stop the sweep: its
row carries the error. `executor="ray"` runs one Ray task per recipe (compressor/run/sweep_ray.py).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any
from collections.abc import Sequence

import numpy as np

from compressor.errors import CompressorError, DataError, UsageError
from compressor.run.pipeline import finish, run_steps
from compressor.config.recipe import Recipe, load_recipe
from compressor.run.session import Session, open_session
from compressor.core.tensors import output_list

ARTIFACT_COLUMNS = ("format", "path", "size_bytes", "gzip_bytes", "metric_value", "drop",
                    "sparsity", "weight_dtypes", "latency_ms_p50", "est_peak_memory_bytes",
                    "fits_target")
# a language model's artifacts also carry these (report.json per LLM artifact)
LM_COLUMNS = ("perplexity", "perplexity_increase", "top1_agreement", "greedy_agreement",
              "prefill_ms", "decode_tokens_per_s", "peak_rss_bytes", "kv_cache_bytes", "context")
# columns where a smaller value is the better one (the Pareto front minimises them)
LOWER_IS_BETTER = {"perplexity", "perplexity_increase", "drop", "latency_ms_p50", "prefill_ms",
                   "peak_rss_bytes", "est_peak_memory_bytes"}


def sweep(model: Any, recipes: Sequence[str | Path | Recipe], data: Any = "digits",
          out_dir: str | Path = "sweep", *, quiet: bool = True, executor: str = "serial",
          address: str | None = None, **options: Any):
    """Run each recipe on `model`; one DataFrame row per (recipe, artifact).

    `executor="ray"` runs the recipes as Ray tasks: on the cluster at `address`, or on a local
    Ray started for this sweep and shut down after it."""
    import pandas as pd

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    recipes = list(recipes)
    if executor == "ray":
        from compressor.run.sweep_ray import run_on_ray

        per_recipe = run_on_ray(sweep_one, model, recipes, data, out, address, quiet=quiet, **options)
    elif executor == "serial":
        if address:
            raise UsageError("address is for executor='ray'; drop it or add executor='ray'")
        per_recipe = [sweep_one(model, ref, data, out, quiet=quiet, **options) for ref in recipes]
    else:
        raise UsageError(f"unknown sweep executor {executor!r}; use 'serial' or 'ray'")
    rows = [row for recipe_rows in per_recipe for row in recipe_rows]
    frame = pd.DataFrame(rows)
    for column in ("recipe", *ARTIFACT_COLUMNS, "passed", "cached", "error"):
        if column not in frame:
            frame[column] = None
    if options.get("target"):
        from compressor.devices import get_profile

        frame.attrs["budget_bytes"] = get_profile(options["target"]).budget_bytes
    return frame


def sweep_one(model: Any, ref: Any, data: Any, out: Path, **options: Any) -> list[dict[str, Any]]:
    """One recipe's rows (cached, computed, or its error); a Ray task runs exactly this."""
    try:
        recipe = load_recipe(ref)
        folder = out / recipe.name
        session = open_session(model, recipe, data, out_dir=folder, force=True, **options)
    except CompressorError as exc:
        return [{"recipe": str(getattr(ref, "name", ref)), "passed": False, "error": str(exc)}]
    key = {"model_sha256": model_digest(model, session), "recipe_sha256": recipe.sha256()}
    cached = _cached_report(folder, key)
    if cached is not None:
        session.ctx.progress.info(f"{recipe.name}: report for this model and recipe exists, skipped")
        _discard(session)
        return _rows(cached, cached=True)
    session.record.add_note("sweep", key)
    try:
        result = finish(session, run_steps(session))
    except CompressorError as exc:
        _discard(session)
        return [{"recipe": recipe.name, "passed": False, "cached": False, "error": str(exc)}]
    return _rows(result.report, cached=False)


def model_digest(model: Any, session: Session) -> str:
    """A model file's bytes, or for an in-memory model its outputs on the val inputs."""
    digest = hashlib.sha256()
    if isinstance(model, (str, Path)) and Path(model).is_file():
        with open(model, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    else:
        digest.update(str(session.info.params).encode())
        for output in output_list(session.ctx.reference_outputs):
            digest.update(np.ascontiguousarray(output, dtype=np.float32).tobytes())
    return digest.hexdigest()


def _cached_report(folder: Path, key: dict[str, str]) -> dict[str, Any] | None:
    path = folder / "report.json"
    if not path.is_file():
        return None
    try:
        report = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    complete = all((folder / art["path"]).exists() for art in report.get("artifacts", []))
    return report if report.get("sweep") == key and complete else None


def _rows(report: dict[str, Any], cached: bool) -> list[dict[str, Any]]:
    name = report["recipe"]["name"]
    columns = ARTIFACT_COLUMNS + (LM_COLUMNS if "perplexity" in report["baseline"] else ())
    return [{"recipe": name, **{k: art.get(k) for k in columns},
             "passed": report["passed"], "cached": cached, "error": None}
            for art in report["artifacts"]]


def _discard(session: Session) -> None:
    import shutil

    shutil.rmtree(session.ctx.workdir, ignore_errors=True)


# ------------------------------------------------------------------------------------ plots

def pareto_front(frame, x: str, y: str):
    """Rows no other row beats: smaller-or-equal `x` and better-or-equal `y` (larger, or smaller
    for perplexity, drop, latency and memory columns), one strictly."""
    sign = -1.0 if lower_is_better(frame, y) else 1.0
    ok = frame.dropna(subset=[x, y])
    ok = ok.assign(_better=sign * ok[y]).sort_values([x, "_better"], ascending=[True, False])
    best = -np.inf
    keep = []
    for index, value in zip(ok.index, ok["_better"]):
        if value > best:
            keep.append(index)
            best = value
    return ok.drop(columns="_better").loc[keep]


def lower_is_better(frame, y: str) -> bool:
    """`metric_value` is a perplexity in a language-model sweep: lower is better there too."""
    return y in LOWER_IS_BETTER or (y == "metric_value" and "perplexity" in frame
                                    and frame["perplexity"].notna().all())


def plot_pareto(frame, x: str = "size_bytes", y: str = "metric_value",
                budget_bytes: int | None = None, title: str | None = None):
    """A matplotlib Figure: every artifact labelled, the Pareto front drawn, the budget marked
    (`budget_bytes`, by default the sweep target's budget kept in `frame.attrs`)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    for column in (x, y):
        if column not in frame:
            raise DataError(f"the sweep table has no column {column!r}; columns: "
                            f"{', '.join(frame.columns)}")
    ok = frame.dropna(subset=[x, y])
    budget_bytes = budget_bytes if budget_bytes is not None else frame.attrs.get("budget_bytes")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter(ok[x], ok[y], color="tab:blue", zorder=3)
    for _, row in ok.iterrows():
        ax.annotate(f"{row['recipe']} ({row['format']})", (row[x], row[y]), fontsize=8,
                    xytext=(4, 4), textcoords="offset points")
    front = pareto_front(ok, x, y)
    ax.plot(front[x], front[y], color="tab:red", drawstyle="steps-post", label="Pareto front",
            zorder=2)
    if budget_bytes is not None:
        ax.axvline(budget_bytes, color="tab:gray", linestyle="--", label="device budget")
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(title or f"{y} vs {x}")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right" if lower_is_better(ok, y) else "lower right")
    fig.tight_layout()
    return fig

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

from compressor.errors import CompressorError, UsageError
from compressor.run.pipeline import finish, run_steps
from compressor.config.recipe import Recipe, load_recipe
from compressor.run.session import Session, open_session
from compressor.core.tensors import output_list
from compressor.core.modes import training_flags_kept
from compressor.tasks import task_of_report


ARTIFACT_COLUMNS = ("format", "path", "size_bytes", "gzip_bytes", "metric_value", "drop",
                    "sparsity", "weight_dtypes", "latency_ms_p50", "est_peak_memory_bytes",
                    "fits_target")



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
        with training_flags_kept(model):   # an in-memory model comes back in its modes
            per_recipe = [sweep_one(model, ref, data, out, quiet=quiet, **options)
                          for ref in recipes]
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
    task = task_of_report(report)
    columns = ARTIFACT_COLUMNS + task.sweep_columns
    return [{"recipe": name, "task": task.name, **{k: art.get(k) for k in columns},
             "passed": report["passed"], "cached": cached, "error": None}
            for art in report["artifacts"]]


def _discard(session: Session) -> None:
    import shutil

    shutil.rmtree(session.ctx.workdir, ignore_errors=True)

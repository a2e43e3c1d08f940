"""A run's inputs, resolved and checked before any work: `open_session`.

The pipeline (compress), the training-loop API (prepare / finalize) and sweeps all start
here, so bad input fails the same way, fast, whichever way in. What depends on what the model
is for (its data, reference outputs and metric) is its task's (compressor/tasks): the model
kind names the task, and the session asks it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compressor.backends import Backend, ModelInfo, UserLoopBackend, resolve_model
from compressor.config.recipe import Recipe, load_recipe
from compressor.config.steps import ValidateConfig
from compressor.core.context import Context
from compressor.core.memory import start_sampling
from compressor.core.record import RunRecord
from compressor.core.workspace import check_output_path
from compressor.errors import RecipeError
from compressor.formats import FORMAT_NAMES, format_names
from compressor.tasks import OpenRequest, Task, task_named
from compressor.tasks.base import describe_ref


@dataclass(frozen=True)
class Session:
    """Every input resolved and checked; `model` is the loaded original, kept untouched as the
    reference. What passes also see (data, formats, reference outputs, baseline) is in `ctx`;
    what the run measures goes to `record` (ctx.record), which only the report reads. `task`
    evaluates the artifacts and shapes the report."""

    recipe: Recipe
    backend: Backend
    task: Task
    model: Any
    model_ref: str
    info: ModelInfo
    ctx: Context
    out_dir: Path
    force: bool
    target: str | None
    measure_latency: bool = True
    threads: int | None = None
    devices: int | None = None   # --devices K: the language model's ONNX artifact split in K
    teacher_entry: dict[str, Any] | None = None   # report.json `teacher`, for distill recipes

    @property
    def record(self) -> RunRecord:
        return self.ctx.record

    @property
    def validation(self) -> ValidateConfig:
        """The gate this run applies: the recipe's, as the task reads it (a language model's:
        by perplexity)."""
        return self.ctx.validation

    @property
    def metric_name(self) -> str:
        metric = self.ctx.metric or self.validation.metric
        return metric if isinstance(metric, str) else getattr(metric, "__name__", "custom")


def open_session(model: Any, recipe: str | Path | Recipe, data: Any = "digits", *,
                 teacher: Any = None, out_dir: str | Path | None = "dist", target: str | None = None,
                 formats: tuple[str, ...] | None = None, seed: int = 0, weights: str | None = None,
                 teacher_weights: str | None = None, trust_pickle: bool = False,
                 force: bool = False, quiet: bool = False, latency: bool = True,
                 threads: int | None = None, metric: Any = None, context: int | None = None,
                 force_plan: bool = False, devices: int | None = None) -> Session:
    started = time.perf_counter()
    start_sampling()   # report.json compress_peak_rss_bytes: this process tree's peak
    recipe = load_recipe(recipe)
    out = Path("." if out_dir is None else out_dir)   # None: named later (cz.prepare)
    if out_dir is not None:
        check_output_folder(out, force)
    requested = tuple(formats or ())
    formats = requested or tuple(recipe.export)
    unknown = [f for f in formats if f not in FORMAT_NAMES]
    if unknown:
        raise RecipeError(f"unknown export format {', '.join(unknown)}; use "
                          f"{' and/or '.join(format_names())}")
    target = target or recipe.target
    if target:
        from compressor.devices import get_profile

        get_profile(target)  # an unknown device is a bad argument: fail before any work

    backend, source = resolve_model(model)
    if recipe.needs_teacher and teacher is None and not getattr(backend, "teaches_itself", False):
        raise RecipeError(f"recipe {recipe.name!r} has a distill step and needs a teacher model; "
                          "pass --teacher MODEL (or teacher=... in Python)")
    task = task_named(backend.task)
    formats, format_note = _formats_written_by(backend, formats, explicit=bool(requested))
    _refuse_training_steps(backend, recipe)
    request = OpenRequest(model_ref=model, recipe=recipe, data=data, formats=formats,
                          formats_asked=bool(requested), seed=seed,
                          quiet=quiet, target=target, metric=metric, context=context,
                          force_plan=force_plan, devices=devices, teacher=teacher,
                          teacher_weights=teacher_weights, trust_pickle=trust_pickle)
    planned = task.before_load(request)
    loaded = backend.load(source, weights=weights, trust_pickle=trust_pickle)
    opened = task.open(request, backend, loaded)
    if format_note:
        opened.ctx.progress.info(format_note)
    session = Session(recipe=recipe, backend=backend, task=task, model=loaded,
                      model_ref=describe_ref(model), info=opened.info, ctx=opened.ctx, out_dir=out,
                      force=force, target=target, measure_latency=latency, threads=threads,
                      devices=devices, teacher_entry=opened.teacher_entry)
    session.record.add_timing("load", time.perf_counter() - started)
    if planned is not None:
        session.record.add_note("plan", planned)   # report.json `plan`, report.html's table
    return session


def check_output_folder(out: Path, force: bool) -> None:
    check_output_path(out, force)


def _formats_written_by(backend: Backend, formats: tuple[str, ...],
                        explicit: bool) -> tuple[tuple[str, ...], str | None]:
    """The formats `backend` can write: asked-for ones it cannot are an error, a recipe's
    default list loses them with a note (an ONNX model gives no TFLite file)."""
    writable = getattr(backend, "export_formats", FORMAT_NAMES)
    dropped = [fmt for fmt in formats if fmt not in writable]
    if not dropped:
        return formats, None
    kept = tuple(fmt for fmt in formats if fmt in writable)
    if explicit or not kept:
        raise RecipeError(f"{backend.name} models cannot be exported to {', '.join(dropped)}: "
                          "compressor cannot make that format from them; use "
                          f"--format {','.join(writable)}")
    return kept, (f"export: {', '.join(dropped)} skipped: {backend.name} models export "
                  f"{', '.join(writable)} only")


def _refuse_training_steps(backend: Backend, recipe: Recipe) -> None:
    """A model kind without a training loop (already-exported models) cannot fine-tune:
    refuse before any work."""
    if isinstance(backend, UserLoopBackend):
        return
    from compressor.backends.post_training import training_refused

    for index, step in enumerate(recipe.steps):
        if step.trains and not backend.trains_step(step):
            raise training_refused(backend, index, step)

"""A run's inputs, resolved and checked before any work: `open_session`.

The pipeline (compress), the training-loop API (prepare / finalize) and sweeps all start
here, so bad input fails the same way, fast, whichever way in.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from compressor.tasks.array import metrics as validate
from compressor.backends import Backend, ModelInfo, UserLoopBackend, framework_of, resolve_model
from compressor.backends.base import Preflight, TextModel
from compressor.core.context import Context, Data
from compressor.tasks.array.data import check_matches_model, load_data
from compressor.errors import DataError, ModelLoadError, RecipeError
from compressor.export import FORMATS
from compressor.core.memory import start_sampling
from compressor.core.progress import Progress
from compressor.config.recipe import Recipe, load_recipe
from compressor.core.record import RunRecord
from compressor.config.steps import ValidateConfig
from compressor.core.tensors import Arrays, output_index, output_list, select_output, take
from compressor.tasks.array.sanity import check_outputs, warn_if_chance
from compressor.core.workspace import check_output_path, make_work_folder


@dataclass(frozen=True)
class Session:
    """Every input resolved and checked; `model` is the loaded original, kept untouched as the
    reference. What passes also see (data, formats, reference outputs, baseline) is in `ctx`;
    what the run measures goes to `record` (ctx.record), which only the report reads."""

    recipe: Recipe
    backend: Backend
    model: Any
    model_ref: str
    info: ModelInfo
    ctx: Context
    out_dir: Path
    force: bool
    target: str | None
    measure_latency: bool = True
    threads: int | None = None
    teacher_entry: dict[str, Any] | None = None   # report.json `teacher`, for distill recipes

    @property
    def record(self) -> RunRecord:
        return self.ctx.record

    @property
    def validation(self) -> ValidateConfig:
        """The gate this run applies: the recipe's (a language model's: by perplexity)."""
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
                 force_plan: bool = False) -> Session:
    started = time.perf_counter()
    start_sampling()   # report.json compress_peak_rss_bytes: this process tree's peak
    recipe = load_recipe(recipe)
    out = Path("." if out_dir is None else out_dir)   # None: named later (cz.prepare)
    if out_dir is not None:
        check_output_folder(out, force)
    requested = tuple(formats or ())
    formats = requested or tuple(recipe.export)
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise RecipeError(f"unknown export format {', '.join(unknown)}; use tflite and/or onnx")
    if recipe.needs_teacher and teacher is None:
        raise RecipeError(f"recipe {recipe.name!r} has a distill step and needs a teacher model; "
                          "pass --teacher MODEL (or teacher=... in Python)")
    target = target or recipe.target
    if target:
        from compressor.devices import get_profile

        get_profile(target)  # an unknown device is a bad argument: fail before any work

    backend, source = resolve_model(model)
    formats, format_note = _formats_written_by(backend, formats, explicit=bool(requested))
    _refuse_training_steps(backend, recipe)
    planned = None
    if isinstance(backend, TextModel):
        from compressor.tasks.lm.session import check_plan_fits

        planned = check_plan_fits(model, recipe, target, context, force_plan)   # before loading
    loaded = backend.load(source, weights=weights, trust_pickle=trust_pickle)
    if isinstance(backend, TextModel):
        from compressor.tasks.lm.session import open_lm_session

        session = Session(**open_lm_session(
            backend, loaded, data, recipe, out=out, model_ref=describe_ref(model), seed=seed,
            formats=formats, format_note=format_note, quiet=quiet, force=force, target=target,
            latency=latency, threads=threads, metric=metric, context=context))
        session.record.add_timing("load", time.perf_counter() - started)
        if planned is not None:
            session.record.add_note("plan", planned)   # report.json `plan`, report.html's table
        return session
    teacher_model = None
    if teacher is not None and recipe.needs_teacher:   # recipes without distill ignore it
        if framework_of(teacher) != backend.name:
            raise ModelLoadError(f"the teacher is a {framework_of(teacher)} model and the student "
                                 f"a {backend.name} one; distil between models of one framework")
        teacher_model = backend.load(teacher, weights=teacher_weights, trust_pickle=trust_pickle)
    data = load_data(data, backend.image_layout, backend.name)
    if data.val is None:
        raise DataError("validation needs a val split (x_val, y_val); the artifacts are checked on it")
    if recipe.needs_train_data and data.train is None:
        raise DataError(f"recipe {recipe.name!r} fine-tunes or calibrates and needs a train split "
                        "(x_train, y_train)")
    info = backend.describe(loaded, example=take(data.val[0], slice(0, 2)))
    check_matches_model(data, info.inputs)
    if isinstance(backend, Preflight):   # a step the model cannot take: refused before any work
        backend.preflight(loaded, tuple(recipe.steps), formats)
    if teacher_model is not None:
        teacher_info = _check_teacher_shapes(backend, loaded, info, teacher_model, data)

    x_val, y_val = data.val
    reference = backend.predict(loaded, x_val)
    metric_used = metric or recipe.validation.metric
    output = recipe.validation.output
    check_outputs(reference, data, metric_used, output)
    baseline = validate.metric_value(metric_used, reference, y_val, reference, output)
    warn_if_chance(metric_used, baseline, select_output(reference, output))
    teacher_entry = None
    if teacher_model is not None:
        teacher_outputs = backend.predict(teacher_model, x_val)
        teacher_entry = {"model": describe_ref(teacher), "params": teacher_info.params,
                         "metric_value": validate.metric_value(metric_used, teacher_outputs, y_val,
                                                               reference, output)}
    workdir = make_work_folder()   # last: nothing above may leave it behind
    ctx = Context(data=data, progress=Progress(quiet=quiet), workdir=workdir, seed=seed,
                  teacher=teacher_model, formats=formats, validation=recipe.validation,
                  metric=metric, reference_outputs=reference, baseline_value=baseline,
                  inputs=info.inputs, outputs=info.outputs,
                  output_index=output_index(info.outputs, output))
    if format_note:
        ctx.progress.info(format_note)
    session = Session(recipe=recipe, backend=backend, model=loaded, model_ref=describe_ref(model),
                      info=info, ctx=ctx, out_dir=out, force=force, target=target,
                      measure_latency=latency, threads=threads, teacher_entry=teacher_entry)
    session.record.add_timing("load", time.perf_counter() - started)
    return session


def check_output_folder(out: Path, force: bool) -> None:
    check_output_path(out, force)


def _formats_written_by(backend: Backend, formats: tuple[str, ...],
                        explicit: bool) -> tuple[tuple[str, ...], str | None]:
    """The formats `backend` can write: asked-for ones it cannot are an error, a recipe's
    default list loses them with a note (an ONNX model gives no TFLite file)."""
    writable = getattr(backend, "export_formats", FORMATS)
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
        if step.trains:
            raise training_refused(backend.name, index, step)


def describe_ref(model: Any) -> str:
    return str(model) if isinstance(model, (str, Path)) else type(model).__qualname__


def _check_teacher_shapes(backend: Backend, student: Any, info: ModelInfo, teacher: Any,
                          data: Data) -> ModelInfo:
    """Teacher and student must read the same inputs and give the same outputs (2 val rows)."""
    rows = take(data.val[0], slice(0, 2))
    student_out = _output_shapes(backend.predict(student, rows))
    try:
        teacher_info = backend.describe(teacher, example=rows)
    except DataError as exc:
        raise ModelLoadError(f"the teacher cannot run the student's inputs (student "
                             f"{info.input_shape} -> {student_out}): {exc}") from None
    teacher_out = (teacher_info.output_shape if teacher_info.input_shape != info.input_shape
                   else _output_shapes(backend.predict(teacher, rows)))
    if teacher_info.input_shape != info.input_shape or teacher_out != student_out:
        raise ModelLoadError(
            "the teacher and the student must agree on input and output shapes: student "
            f"{info.input_shape} -> {student_out}, teacher {teacher_info.input_shape} -> "
            f"{teacher_out}; distil from a teacher trained on the same inputs and outputs")
    return teacher_info


def _output_shapes(outputs: Arrays) -> tuple:
    shapes = [(None, *o.shape[1:]) for o in output_list(outputs)]
    return shapes[0] if len(shapes) == 1 else tuple(shapes)

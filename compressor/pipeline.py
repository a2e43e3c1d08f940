"""One compression run: load -> steps -> export -> validate -> report.

Split in three so the training-loop API (prepare / finalize) and sweeps reuse the same parts:
`open_session` resolves and checks every input before any work, `run_steps` applies the
recipe, `finish` exports, validates in the real runtimes, reports and publishes atomically.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from compressor import validate
from compressor.backends import Backend, ModelInfo, backend_for, framework_of
from compressor.context import Context, Data, ModelState
from compressor.data import check_matches_model, load_data
from compressor.errors import DataError, ModelLoadError, RecipeError
from compressor.progress import Progress
from compressor.recipe import Recipe, load_recipe
from compressor.registry import StepConfig, get_pass
from compressor.report import package_versions, write_report


@dataclass
class Result:
    """What a run produced. `exit_code`: 0 passed, 3 accuracy gate failed, 4 over budget."""

    passed: bool
    exit_code: int
    out_dir: Path
    artifacts: dict[str, Path]
    report: dict[str, Any]


@dataclass
class Session:
    """Every input resolved and checked; the original model is kept untouched for reference."""

    recipe: Recipe
    backend: Backend
    model: Any
    model_ref: str
    info: ModelInfo
    data: Data
    ctx: Context
    out_dir: Path
    force: bool
    formats: tuple[str, ...]
    target: str | None
    reference_outputs: np.ndarray
    baseline_value: float
    teacher: dict[str, Any] | None = None   # the report's teacher entry, for distill recipes
    options: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)


def open_session(model: Any, recipe: str | Path | Recipe, data: Any = "digits", *,
                 teacher: Any = None, out_dir: str | Path = "dist", target: str | None = None,
                 formats: tuple[str, ...] | None = None, seed: int = 0, weights: str | None = None,
                 teacher_weights: str | None = None, trust_pickle: bool = False,
                 force: bool = False, quiet: bool = False, latency: bool = True,
                 threads: int | None = None, metric: Any = None) -> Session:
    started = time.perf_counter()
    recipe = load_recipe(recipe)
    out = Path(out_dir)
    check_output_folder(out, force)
    formats = tuple(formats or recipe.export)
    unknown = [f for f in formats if f not in ("tflite", "onnx")]
    if unknown:
        raise RecipeError(f"unknown export format {', '.join(unknown)}; use tflite and/or onnx")
    if recipe.needs_teacher and teacher is None:
        raise RecipeError(f"recipe {recipe.name!r} has a distill step and needs a teacher model; "
                          "pass --teacher MODEL (or teacher=... in Python)")
    target = target or recipe.target
    if target:
        from compressor.devices import get_profile

        get_profile(target)  # an unknown device is a bad argument: fail before any work

    backend = backend_for(model)
    loaded = backend.load(model, weights=weights, trust_pickle=trust_pickle)
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
    info = backend.describe(loaded, example=np.asarray(data.val[0][:2]))
    check_matches_model(data, info.input_shape, info.input_dtype)
    if teacher_model is not None:
        teacher_info = _check_teacher_shapes(backend, loaded, info, teacher_model, data)

    progress = Progress(quiet=quiet)
    workdir = Path(tempfile.mkdtemp(prefix="compressor-work-"))
    reference = backend.predict(loaded, np.asarray(data.val[0]))
    validation = recipe.validation
    baseline = validate.metric_value(metric or validation.metric, reference, data.val[1], reference)
    teacher_entry = None
    if teacher_model is not None:
        teacher_outputs = backend.predict(teacher_model, np.asarray(data.val[0]))
        teacher_entry = {"model": _describe_ref(teacher), "params": teacher_info.params,
                         "metric_value": validate.metric_value(metric or validation.metric,
                                                               teacher_outputs, data.val[1],
                                                               reference)}
    ctx = Context(data=data, backend=backend, progress=progress, workdir=workdir, seed=seed,
                  teacher=teacher_model, validation=validation, metric=metric,
                  reference_outputs=reference, baseline_value=baseline, formats=formats)
    session = Session(recipe=recipe, backend=backend, model=loaded, model_ref=_describe_ref(model),
                      info=info, data=data, ctx=ctx, out_dir=out, force=force, formats=formats,
                      target=target, reference_outputs=reference, baseline_value=baseline,
                      teacher=teacher_entry,
                      options={"latency": latency, "threads": threads, "metric": metric})
    session.timings["load"] = time.perf_counter() - started
    return session


def run_steps(session: Session, state: ModelState | None = None,
              steps: Sequence[tuple[int, StepConfig]] | None = None) -> ModelState:
    """Apply the recipe's steps, or only `steps` ((index, step) pairs of them), to `state`."""
    state = state or ModelState(model=session.backend.clone(session.model))
    for index, step in (enumerate(session.recipe.steps) if steps is None else steps):
        session.ctx.progress.info(f"[{index + 1}/{len(session.recipe.steps)}] {step.kind}")
        started = time.perf_counter()
        state = get_pass(step.kind)(state, step, session.ctx)
        key = step.kind if step.kind not in session.timings else f"{step.kind}.{index}"
        session.timings[key] = time.perf_counter() - started
    return state


def finish(session: Session, state: ModelState) -> Result:
    """Export every format into a staging folder, validate, report, then publish into out_dir."""
    staging = Path(tempfile.mkdtemp(prefix=f".{session.out_dir.name}.partial-",
                                    dir=_existing_parent(session.out_dir)))
    try:
        artifacts = _export_all(session, state, staging)
        rows = _validate_all(session, artifacts)
        report = build_report(session, rows, _judge(session, rows))
        if state.fallback is not None:
            report["fallback"] = state.fallback.report(artifacts)
        write_report(report, staging)
        published = publish(staging, session.out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(session.ctx.workdir, ignore_errors=True)
    return Result(passed=report["passed"], exit_code=report["exit_code"], out_dir=session.out_dir,
                  artifacts={fmt: published / path.name for fmt, path in artifacts.items()},
                  report=report)


def compress(model: Any, recipe: str | Path | Recipe, data: Any = "digits", **options: Any) -> Result:
    """The whole run, as the `compress` command does it."""
    session = open_session(model, recipe, data, **options)
    try:
        state = run_steps(session)
    except BaseException:
        shutil.rmtree(session.ctx.workdir, ignore_errors=True)
        raise
    return finish(session, state)


# ---------------------------------------------------------------------------------- helpers

def check_output_folder(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise RecipeError(f"--out {out} is a file; give a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise RecipeError(f"--out {out} exists and is not empty; pass --force to overwrite its "
                          "artifacts and report, or choose another folder")


def publish(staging: Path, out: Path) -> Path:
    """Move finished files into `out`: a rename when it is new, else file by file (only ours)."""
    if not out.exists():
        staging.rename(out)
        return out
    for item in staging.iterdir():
        item.replace(out / item.name)
    return out


def _export_all(session: Session, state: ModelState, staging: Path) -> dict[str, Path]:
    artifacts = {}
    for fmt in session.formats:
        started = time.perf_counter()
        session.ctx.progress.info(f"export {fmt}")
        artifacts[fmt] = session.backend.export(state, fmt, staging / f"model.{fmt}", session.ctx)
        session.timings[f"export_{fmt}"] = time.perf_counter() - started
    return artifacts


def _validate_all(session: Session, artifacts: dict[str, Path]) -> list[dict[str, Any]]:
    rows = []
    started = time.perf_counter()
    for path in artifacts.values():
        session.ctx.progress.info(f"validate {path.name} in its runtime")
        rows.append(validate.evaluate_artifact(
            path, session.data, session.reference_outputs, session.baseline_value,
            session.recipe.validation, metric=session.options["metric"],
            latency=session.options["latency"], threads=session.options["threads"]))
    session.timings["validate"] = time.perf_counter() - started
    return rows


def _judge(session: Session, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Apply the accuracy gate and the device budget to each artifact (mutates rows' fits_target)."""
    failures = []
    for row in rows:
        if not validate.gate_passes(session.recipe.validation, row["metric_value"], row["drop"]):
            failures.append(f"{row['path']} {session.recipe.validation.metric} drop "
                            f"{row['drop']:.4f} > {session.recipe.validation.max_drop}")
    gate_passed = not failures
    budget = None
    if session.target:
        from compressor.devices import get_profile

        budget = get_profile(session.target).budget_bytes
    for row in rows:
        row["fits_target"] = budget is None or row["est_peak_memory_bytes"] <= budget
        if not row["fits_target"]:
            failures.append(f"{row['path']} needs ~{row['est_peak_memory_bytes']:,} bytes, over "
                            f"the {session.target} budget of {budget:,} bytes")
    fits = all(row["fits_target"] for row in rows)
    exit_code = 0 if gate_passed and fits else (3 if not gate_passed else 4)
    return {"gate_passed": gate_passed, "fits": fits, "budget_bytes": budget,
            "failures": failures, "exit_code": exit_code}


def build_report(session: Session, rows: list[dict[str, Any]], verdict: dict[str, Any]) -> dict:
    recipe = session.recipe
    validation = recipe.validation
    return {
        "recipe": {"name": recipe.name, "sha256": recipe.sha256()},
        "seed": session.ctx.seed,
        "target": session.target,
        "budget_bytes": verdict["budget_bytes"],
        "framework": session.backend.name,
        "model": session.model_ref,
        "data": session.data.name,
        "baseline": {"metric": _metric_name(session), "value": session.baseline_value,
                     "size_bytes": session.info.size_bytes, "params": session.info.params},
        "teacher": session.teacher,
        "artifacts": rows,
        "gate": {"max_drop": validation.max_drop, "min_fidelity": validation.min_fidelity,
                 "passed": verdict["gate_passed"]},
        "passed": verdict["gate_passed"] and verdict["fits"],
        "exit_code": verdict["exit_code"],
        "failures": verdict["failures"],
        "timings_s": {k: round(v, 3) for k, v in session.timings.items()},
        "versions": package_versions(),
        **session.options.get("report_extras", {}),
    }


def _check_teacher_shapes(backend: Backend, student: Any, info: ModelInfo, teacher: Any,
                          data: Data) -> ModelInfo:
    """Teacher and student must read the same inputs and give the same outputs (2 val rows)."""
    rows = np.asarray(data.val[0][:2])
    student_out = (None, *backend.predict(student, rows).shape[1:])
    try:
        teacher_info = backend.describe(teacher, example=rows)
    except DataError as exc:
        raise ModelLoadError(f"the teacher cannot run the student's inputs (student "
                             f"{info.input_shape} -> {student_out}): {exc}") from None
    teacher_out = (teacher_info.output_shape if teacher_info.input_shape != info.input_shape
                   else (None, *backend.predict(teacher, rows).shape[1:]))
    if teacher_info.input_shape != info.input_shape or teacher_out != student_out:
        raise ModelLoadError(
            "the teacher and the student must agree on input and output shapes: student "
            f"{info.input_shape} -> {student_out}, teacher {teacher_info.input_shape} -> "
            f"{teacher_out}; distil from a teacher trained on the same inputs and outputs")
    return teacher_info


def _metric_name(session: Session) -> str:
    metric = session.options["metric"] or session.recipe.validation.metric
    return metric if isinstance(metric, str) else getattr(metric, "__name__", "custom")


def _existing_parent(out: Path) -> Path:
    parent = out.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    return parent


def _describe_ref(model: Any) -> str:
    return str(model) if isinstance(model, (str, Path)) else type(model).__qualname__

"""An array model's session: its data laid out for its framework, checked against its inputs,
the original model's outputs on the val split (the reference every artifact is compared with),
its baseline metric, and the teacher of a distill recipe."""
from __future__ import annotations

from typing import Any

from compressor.backends import ModelInfo, framework_of
from compressor.backends.base import Preflight
from compressor.core.context import Context, Data
from compressor.core.progress import Progress
from compressor.core.tensors import Arrays, output_index, output_list, select_output, take
from compressor.core.workspace import make_work_folder
from compressor.errors import DataError, ModelLoadError
from compressor.tasks.array.data import check_matches_model, load_data
from compressor.tasks.array.metrics import metric_value
from compressor.tasks.array.sanity import check_outputs, warn_if_chance
from compressor.tasks.base import Opened, OpenRequest, describe_ref


def open_array(request: OpenRequest, backend: Any, model: Any) -> Opened:
    recipe = request.recipe
    teacher_model = None
    if request.teacher is not None and recipe.needs_teacher:   # recipes without distill ignore it
        if framework_of(request.teacher) != backend.name:
            raise ModelLoadError(f"the teacher is a {framework_of(request.teacher)} model and the "
                                 f"student a {backend.name} one; distil between models of one "
                                 "framework")
        teacher_model = backend.load(request.teacher, weights=request.teacher_weights,
                                     trust_pickle=request.trust_pickle)
    data = load_data(request.data, backend.image_layout, backend.name)
    if data.val is None:
        raise DataError("validation needs a val split (x_val, y_val); the artifacts are checked on it")
    if recipe.needs_train_data and data.train is None:
        raise DataError(f"recipe {recipe.name!r} fine-tunes or calibrates and needs a train split "
                        "(x_train, y_train)")
    info = backend.describe(model, example=take(data.val[0], slice(0, 2)))
    check_matches_model(data, info.inputs)
    if isinstance(backend, Preflight):   # a step the model cannot take: refused before any work
        backend.preflight(model, tuple(recipe.steps), request.formats)
    if teacher_model is not None:
        teacher_info = _check_teacher_shapes(backend, model, info, teacher_model, data)

    x_val, y_val = data.val
    reference = backend.predict(model, x_val)
    metric_used = request.metric or recipe.validation.metric
    output = recipe.validation.output
    check_outputs(reference, data, metric_used, output)
    baseline = metric_value(metric_used, reference, y_val, reference, output)
    warn_if_chance(metric_used, baseline, select_output(reference, output))
    teacher_entry = None
    if teacher_model is not None:
        teacher_outputs = backend.predict(teacher_model, x_val)
        teacher_entry = {"model": describe_ref(request.teacher), "params": teacher_info.params,
                         "metric_value": metric_value(metric_used, teacher_outputs, y_val,
                                                      reference, output)}
    workdir = make_work_folder()   # last: nothing above may leave it behind
    ctx = Context(data=data, progress=Progress(quiet=request.quiet), workdir=workdir,
                  seed=request.seed, teacher=teacher_model, formats=request.formats,
                  validation=recipe.validation, metric=request.metric,
                  reference_outputs=reference, baseline_value=baseline, inputs=info.inputs,
                  outputs=info.outputs, output_index=output_index(info.outputs, output))
    return Opened(info=info, ctx=ctx, teacher_entry=teacher_entry)


def _check_teacher_shapes(backend: Any, student: Any, info: ModelInfo, teacher: Any,
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

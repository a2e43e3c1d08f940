"""A Keras model's named inputs and outputs: describe, predict, and feeding data in order.

Inputs are the model's Input layers by name (data dicts are matched to them by name, by
position when the names differ); outputs are named after the model's output layers (the keys,
for a model built with a dict of outputs).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from compressor.backends.base import ModelInfo
from compressor.core.int8_mode import layer_kinds
from compressor.core.tensors import Arrays, TensorSpec, concat, matched, rows, take

FLOAT32_BYTES = 4


def input_specs(model: Any) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(name, (None, *tuple(t.shape)[1:]), t.dtype.name)
                 for name, t in zip(model.input_names, model.inputs))


def output_names(model: Any) -> list[str]:
    """In `model.outputs` order: a dict of outputs is flattened by sorted key (tf.nest)."""
    structure = getattr(model, "_nested_outputs", None)
    if isinstance(structure, dict):
        return sorted(structure)
    return list(model.output_names)


def describe(model: Any) -> ModelInfo:
    """Keras models declare their inputs and outputs: no example is needed."""
    params = int(model.count_params())
    outputs = tuple(TensorSpec(name, (None, *tuple(t.shape)[1:]), t.dtype.name)
                    for name, t in zip(output_names(model), model.outputs))
    classes = [type(layer).__name__ for layer in model.submodules]
    return ModelInfo(params=params, inputs=input_specs(model), outputs=outputs,
                     size_bytes=params * FLOAT32_BYTES, layer_kinds=layer_kinds(classes))


def model_inputs(model: Any, x: Arrays) -> Any:
    """What `model(...)` takes for x: one array, or a list in the model's input order."""
    arrays = matched(x, list(model.input_names))
    return arrays[0] if len(arrays) == 1 else arrays


def named_outputs(model: Any, outputs: Any) -> Arrays:
    """One array, or a dict output name -> array in the model's output order."""
    if isinstance(outputs, dict):
        return {name: np.asarray(outputs[name]) for name in output_names(model)}
    if isinstance(outputs, (list, tuple)):
        if len(outputs) == 1:
            return np.asarray(outputs[0])
        return dict(zip(output_names(model), (np.asarray(o) for o in outputs)))
    return np.asarray(outputs)


def predict(model: Any, x: Arrays, batch_size: int = 256) -> Arrays:
    """Every output for `x`, in inference mode (dropout off, BatchNorm frozen).

    Eager calls, not model.predict: predict traces a new tf.function per model, and a
    sweep over many models triggers TensorFlow's retracing warnings.
    """
    batches = [named_outputs(model, model(model_inputs(model, take(x, slice(lo, lo + batch_size))),
                                          training=False))
               for lo in range(0, rows(x), batch_size)]
    return concat(batches)


def original_names(model: Any, ctx: Any) -> dict[str, str]:
    """`model`'s input / output names -> the original model's (artifacts keep the original's:
    tfmot renames wrapped output layers `quant_<name>`)."""
    ours = [*model.input_names, *model.output_names]   # what converters name the I/O after
    theirs = [spec.name for spec in (*ctx.inputs, *ctx.outputs)]
    return dict(zip(ours, theirs)) if len(ours) == len(theirs) else {}


def calibration_inputs(model: Any, ctx: Any, count: int) -> dict[str, np.ndarray]:
    """`count` training inputs per model input name, each in that input's dtype."""
    from compressor.backends.training_data import calibration_samples

    arrays = matched(calibration_samples(ctx, count), list(model.input_names))
    return {name: array.astype(tensor.dtype.as_numpy_dtype)
            for name, array, tensor in zip(model.input_names, arrays, model.inputs)}

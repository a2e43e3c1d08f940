"""The SavedModel handler table: the refusals of what a SavedModel cannot do (train, keep
layers float, int8 I/O), TFLite from the SavedModel's own converter (saved_model/convert.py),
and ONNX through the ONNX backend's route on tf2onnx's float32 graph.

The conversion modules are imported inside the handlers: registering them costs no
TensorFlow import.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from compressor.backends.onnx.handlers import refuse_int8_io, register_onnx_route
from compressor.backends.post_training import register_training_refusal
from compressor.errors import RecipeError
from compressor.schemes import (Float16, Float32, Int8Scheme, Int8Static, apply_handler,
                                export_handler)

if TYPE_CHECKING:
    from compressor.backends.onnx.model import OnnxModel
    from compressor.core.context import Context, ModelState

KIND = "saved_model"


@apply_handler(Int8Scheme, KIND)
def _check_int8(backend: Any, state: ModelState, scheme: Int8Scheme, ctx: Context) -> ModelState:
    """Nothing to do before export, which calibrates (ptq) or quantizes (dynamic,
    weight_only) the float model; what a SavedModel cannot do is refused."""
    if scheme.fallback == "auto":
        raise RecipeError("quantize fallback: auto is not available for SavedModels (their "
                          "layers cannot be named for the converters); use the int8 recipe, "
                          "or convert the model to .onnx and compress that")
    refuse_int8_io(KIND, scheme)
    return state


register_training_refusal(KIND)   # qat


# TFLite: tf.lite.TFLiteConverter.from_saved_model

@export_handler(Float32, KIND, "tflite", made_by="TFLiteConverter from the SavedModel, float32")
def _tflite_float32(backend: Any, state: ModelState, scheme: Float32, path: Path,
                    ctx: Context) -> Path:
    import compressor.backends.saved_model.convert as convert

    return convert.tflite_float32(state.model, path, ctx)


@export_handler(Float16, KIND, "tflite",
                made_by="TFLiteConverter from the SavedModel, float16 weights, float32 I/O")
def _tflite_float16(backend: Any, state: ModelState, scheme: Float16, path: Path,
                    ctx: Context) -> Path:
    import compressor.backends.saved_model.convert as convert

    return convert.tflite_float16(state.model, scheme, path, ctx)


@export_handler(Int8Static, KIND, "tflite",
                made_by="TFLiteConverter from the SavedModel, full int8, activation ranges "
                        "calibrated on training samples, float32 I/O")
def _tflite_ptq(backend: Any, state: ModelState, scheme: Int8Static, path: Path,
                ctx: Context) -> Path:
    import compressor.backends.saved_model.convert as convert

    return convert.tflite_int8(state.model, scheme, path, ctx)


@export_handler(Int8Scheme, KIND, "tflite",
                made_by="none: SavedModels get the int8 modes other than ptq in ONNX only")
def _tflite_refused(backend: Any, state: ModelState, scheme: Int8Scheme, path: Path,
                    ctx: Context) -> Path:
    raise RecipeError(f"quantize mode {scheme.name} is made for SavedModels in ONNX only; "
                      "use --format onnx, or mode: ptq")


# ONNX: tf2onnx's float32 graph of the SavedModel, then the ONNX backend's route

def _float_graph(state: ModelState, ctx: Context) -> OnnxModel:
    import compressor.backends.saved_model.convert as convert

    return convert.float32_onnx(state.model, ctx)


register_onnx_route(KIND, _float_graph)

"""The Keras handler table: what each scheme does to a tf_keras model (QAT fine-tunes a
fake-quant copy; the other schemes need nothing before export) and which converter writes
it in each format (keras/tflite.py, keras/onnx.py).

The conversion modules are imported inside the handlers: registering them costs no
TensorFlow import.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from compressor.backends.onnx.handlers import ORT_INT8
from compressor.schemes import (Float16, Float32, Int8Dynamic, Int8Qat, Int8Scheme, Int8Static,
                                Int8WeightOnly, apply_handler, export_handler)

if TYPE_CHECKING:
    from compressor.core.context import Context, ModelState

KIND = "keras"
TFLITE_INT8_WEIGHTS = ("ai-edge-quantizer {recipe} on the float32 TFLiteConverter file: int8 "
                       "weights per channel, {compute}")
QAT_ONNX = ("tf2onnx of the QAT model's float layers with their trained weights, then "
            "onnxruntime quantize_static (QDQ, int8 weights per channel) twice: with the "
            "activation ranges QAT learned and recalibrated on training samples; the file "
            "closer to the float graph kept")


@apply_handler(Int8Qat, KIND)
def _qat(backend: Any, state: ModelState, scheme: Int8Qat, ctx: Context) -> ModelState:
    """A fake-quant copy fine-tuned for the step's epochs: the ranges it learns are the
    TFLite file's."""
    from compressor.backends.keras.optimize import quantization_aware_model

    return state.replace(model=quantization_aware_model(state, scheme.training, ctx))


# TFLite

@export_handler(Float32, KIND, "tflite", made_by="TFLiteConverter, float32")
def _tflite_float32(backend: Any, state: ModelState, scheme: Float32, path: Path,
                    ctx: Context) -> Path:
    import compressor.backends.keras.tflite as tflite

    return tflite.write_tflite(state, tflite.float32_tflite(state.model, ctx), path, ctx)


@export_handler(Float16, KIND, "tflite",
                made_by="TFLiteConverter float32, conv / dense weights and embedding tables "
                        "then stored float16 (excluded layers' kept float32); other constants "
                        "and I/O float32")
def _tflite_float16(backend: Any, state: ModelState, scheme: Float16, path: Path,
                    ctx: Context) -> Path:
    import compressor.backends.keras.tflite as tflite

    return tflite.write_tflite(state, tflite.float16_tflite(state.model, scheme, ctx), path, ctx)


@export_handler(Int8Static, KIND, "tflite",
                made_by="TFLiteConverter full int8, activation ranges calibrated on training "
                        "samples (float layers left float by the MLIR quantizer's deny list)")
def _tflite_ptq(backend: Any, state: ModelState, scheme: Int8Static, path: Path,
                ctx: Context) -> Path:
    import compressor.backends.keras.tflite as tflite

    content = tflite.ptq_tflite(state, scheme, ctx, backend.conversions)
    return tflite.write_tflite(state, content, path, ctx)


@export_handler(Int8Qat, KIND, "tflite",
                made_by="TFLiteConverter full int8 with the ranges tfmot QAT learned")
def _tflite_qat(backend: Any, state: ModelState, scheme: Int8Qat, path: Path,
                ctx: Context) -> Path:
    import compressor.backends.keras.tflite as tflite

    content = tflite.qat_tflite(state, scheme, ctx, backend.conversions)
    return tflite.write_tflite(state, content, path, ctx)


def _tflite_int8_weights(backend: Any, state: ModelState, scheme: Int8Scheme, path: Path,
                         ctx: Context) -> Path:
    import compressor.backends.keras.tflite as tflite

    content = tflite.int8_weights_tflite(state.model, scheme, ctx)
    return tflite.write_tflite(state, content, path, ctx)


export_handler(Int8Dynamic, KIND, "tflite", made_by=TFLITE_INT8_WEIGHTS.format(
    recipe="dynamic_wi8_afp32", compute="activations quantized at run time"))(_tflite_int8_weights)
export_handler(Int8WeightOnly, KIND, "tflite", made_by=TFLITE_INT8_WEIGHTS.format(
    recipe="weight_only_wi8_afp32", compute="float compute"))(_tflite_int8_weights)


# ONNX

@export_handler(Float32, KIND, "onnx", made_by="tf2onnx, float32")
def _onnx_float32(backend: Any, state: ModelState, scheme: Float32, path: Path,
                  ctx: Context) -> Path:
    import compressor.backends.keras.onnx as onnx

    return onnx.onnx_float32(state.model, path, ctx)


@export_handler(Float16, KIND, "onnx",
                made_by="tf2onnx, then onnxruntime's float16 converter, float32 I/O")
def _onnx_float16(backend: Any, state: ModelState, scheme: Float16, path: Path,
                  ctx: Context) -> Path:
    import compressor.backends.keras.onnx as onnx

    return onnx.onnx_float16(state.model, scheme, path, ctx)


def _onnx_int8(backend: Any, state: ModelState, scheme: Int8Scheme, path: Path,
               ctx: Context) -> Path:
    import compressor.backends.keras.onnx as onnx

    return onnx.onnx_int8(state.model, scheme, state.float_layers, path, ctx)


for _scheme, _made_by in ORT_INT8.items():   # ptq, dynamic, weight_only
    export_handler(_scheme, KIND, "onnx", made_by=f"tf2onnx, then {_made_by}")(_onnx_int8)


@export_handler(Int8Qat, KIND, "onnx", made_by=QAT_ONNX)
def _onnx_qat(backend: Any, state: ModelState, scheme: Int8Qat, path: Path,
              ctx: Context) -> Path:
    import compressor.backends.keras.onnx as onnx
    from compressor.backends.keras.io import calibration_inputs
    from compressor.backends.keras.optimize import without_fake_quant
    from compressor.backends.keras.qat_ranges import learned_ranges
    from compressor.export.onnx_ranges import MATCH_ROWS

    plain = without_fake_quant(state.model)
    return onnx.onnx_int8(plain, scheme, state.float_layers, path, ctx, lambda: learned_ranges(
        state.model, plain, calibration_inputs(plain, ctx, MATCH_ROWS)))

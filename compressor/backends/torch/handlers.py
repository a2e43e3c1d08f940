"""The PyTorch backend's handler table: what each scheme does to an nn.Module before export
(apply) and which converter writes each format (export).

- int8 ptq / qat: torchao PT2E prepares the model (qat: fine-tuned with fake-quant, ptq:
  observers calibrated); litert-torch converts that graph with its q/dq ranges, while the
  ONNX file is the graph's float weights quantized again by onnxruntime.
- int8 dynamic / weight_only, float32, float16: nothing to apply; the exporters convert the
  float model.

Importing this module imports no framework: the conversion modules are imported inside the
handlers when they run.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from compressor.schemes import (Float16, Float32, Int8Dynamic, Int8Qat, Int8Scheme, Int8Static,
                                Int8WeightOnly, apply_handler, export_handler)

if TYPE_CHECKING:
    from compressor.context import Context, ModelState
    from compressor.tensors import Arrays

KIND = "torch"
ONNX_EXAMPLE_ROWS = 2   # the dynamo exporter keeps a batch of 2+ dynamic (1 is specialized)
TFLITE_EXAMPLE_ROWS = 1   # the .tflite has a batch of 1 (see tflite.py)

ORT_STATIC = "onnxruntime quantize_static (QDQ, int8 weights per channel) of the torch.onnx " \
             "float graph, activation ranges recalibrated on training samples"


def _example(ctx: Context, rows: int) -> Arrays:
    from compressor.backends.torch.infer import example_input

    return example_input(ctx, rows)


# --- apply ----------------------------------------------------------------------------------

@apply_handler(Int8Qat, KIND)
def _qat(backend: Any, state: ModelState, scheme: Int8Qat, ctx: Context) -> ModelState:
    """A PT2E graph whose fake-quant modules hold the fine-tuned int8 ranges."""
    from compressor.backends.torch.quant import qat_model

    return state.replace(model=qat_model(state, scheme.training, ctx))


@apply_handler(Int8Static, KIND)
def _ptq(backend: Any, state: ModelState, scheme: Int8Static, ctx: Context) -> ModelState:
    """A PT2E graph whose observers hold the calibrated int8 ranges."""
    from compressor.backends.torch.quant import ptq_model

    return state.replace(model=ptq_model(state, scheme, ctx))


# --- onnx -----------------------------------------------------------------------------------

@export_handler(Float32, KIND, "onnx", made_by="torch.onnx dynamo exporter, float32")
def _onnx_float32(backend: Any, state: ModelState, scheme: Float32, path: Path,
                  ctx: Context) -> Path:
    from compressor.backends.torch.onnx import onnx_float32

    return onnx_float32(state, path, ctx, _example(ctx, ONNX_EXAMPLE_ROWS))


@export_handler(Float16, KIND, "onnx", made_by="torch.onnx dynamo exporter, float16 weights by "
                "onnxruntime's float16 converter, float32 I/O")
def _onnx_float16(backend: Any, state: ModelState, scheme: Float16, path: Path,
                  ctx: Context) -> Path:
    from compressor.backends.torch.onnx import onnx_float16

    return onnx_float16(state, scheme, path, ctx, _example(ctx, ONNX_EXAMPLE_ROWS))


@export_handler(Int8Static, KIND, "onnx", made_by=ORT_STATIC + " (PT2E's calibrated ranges "
                "are not carried into ONNX)")
@export_handler(Int8Qat, KIND, "onnx", made_by=ORT_STATIC + " (QAT's learned ranges are not "
                "carried into ONNX; its trained weights are)")
def _onnx_int8_static(backend: Any, state: ModelState, scheme: Int8Scheme, path: Path,
                      ctx: Context) -> Path:
    from compressor.backends.torch.onnx import onnx_int8_static

    return onnx_int8_static(state, scheme, path, ctx, _example(ctx, ONNX_EXAMPLE_ROWS))


@export_handler(Int8Dynamic, KIND, "onnx", made_by="onnxruntime quantize_dynamic (int8 weights "
                "per channel) of the torch.onnx float graph, activation ranges computed at run "
                "time")
@export_handler(Int8WeightOnly, KIND, "onnx", made_by="onnxruntime weight-only int8 "
                "(DequantizeLinear per weight, per channel) of the torch.onnx float graph, "
                "float compute")
def _onnx_int8_weights(backend: Any, state: ModelState, scheme: Int8Scheme, path: Path,
                       ctx: Context) -> Path:
    from compressor.backends.torch.onnx import onnx_int8_weights

    return onnx_int8_weights(state, scheme, path, ctx, _example(ctx, ONNX_EXAMPLE_ROWS))


# --- tflite ---------------------------------------------------------------------------------

@export_handler(Float32, KIND, "tflite", made_by="litert-torch converter, float32")
def _tflite_float32(backend: Any, state: ModelState, scheme: Float32, path: Path,
                    ctx: Context) -> Path:
    from compressor.backends.torch.tflite import tflite_float32

    return tflite_float32(state, path, ctx, _example(ctx, TFLITE_EXAMPLE_ROWS))


@export_handler(Float16, KIND, "tflite", made_by="litert-torch converter, float16 weights by "
                "ai-edge-quantizer (a DEQUANTIZE per weight), float32 I/O")
def _tflite_float16(backend: Any, state: ModelState, scheme: Float16, path: Path,
                    ctx: Context) -> Path:
    from compressor.backends.torch.tflite import tflite_float16

    return tflite_float16(state, scheme, path, ctx, _example(ctx, TFLITE_EXAMPLE_ROWS))


@export_handler(Int8Static, KIND, "tflite", made_by="torchao PT2E (XNNPACK quantizer), ranges "
                "calibrated on training samples, litert-torch converter")
@export_handler(Int8Qat, KIND, "tflite", made_by="torchao PT2E QAT, the learned fake-quant "
                "ranges, litert-torch converter")
def _tflite_int8_static(backend: Any, state: ModelState, scheme: Int8Scheme, path: Path,
                        ctx: Context) -> Path:
    from compressor.backends.torch.tflite import tflite_int8_static

    return tflite_int8_static(state, scheme, path, ctx, _example(ctx, TFLITE_EXAMPLE_ROWS))


@export_handler(Int8Dynamic, KIND, "tflite", made_by="litert-torch converter, ai-edge-quantizer "
                "dynamic int8 (int8 weights per channel), activation ranges computed at run time")
@export_handler(Int8WeightOnly, KIND, "tflite", made_by="litert-torch converter, "
                "ai-edge-quantizer weight-only int8 (a DEQUANTIZE per weight), float compute")
def _tflite_int8_weights(backend: Any, state: ModelState, scheme: Int8Scheme, path: Path,
                         ctx: Context) -> Path:
    from compressor.backends.torch.tflite import tflite_int8_weights

    return tflite_int8_weights(state, scheme, path, ctx, _example(ctx, TFLITE_EXAMPLE_ROWS))

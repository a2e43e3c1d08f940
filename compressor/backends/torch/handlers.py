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

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compressor.schemes import (Float16, Float32, Int8Dynamic, Int8Qat, Int8Static,
                                Int8WeightOnly, Scheme, apply_handler, export_handler)

if TYPE_CHECKING:
    from compressor.core.context import Context, ModelState
    from compressor.core.tensors import Arrays

KIND = "torch"
ONNX_EXAMPLE_ROWS = 2   # the dynamo exporter keeps a batch of 2+ dynamic (1 is specialized)
TFLITE_EXAMPLE_ROWS = 1   # the .tflite has a batch of 1 (see tflite.py)

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


# --- export: (scheme, converter function in torch/<format>.py, made_by) per format ----------

# litert-torch 0.10 converts no dynamic batch (tflite.py): say so where the file is described
TFLITE_BATCH = "; batch fixed at 1 (LiteRT runs larger batches row by row)"
ORT_STATIC = ("onnxruntime quantize_static (QDQ, int8 weights per channel) of the torch.onnx "
              "float graph, activation ranges recalibrated on training samples")
EXPORTS = {
    "onnx": (
        (Float32, "onnx_float32", "torch.onnx dynamo exporter, float32"),
        (Float16, "onnx_float16", "torch.onnx dynamo exporter, float16 weights by onnxruntime's "
                                  "float16 converter, float32 I/O"),
        (Int8Static, "onnx_int8_static",
         ORT_STATIC + " (PT2E's calibrated ranges are not carried into ONNX)"),
        (Int8Qat, "onnx_int8_static", ORT_STATIC + " (QAT's learned ranges are not carried into "
                                                   "ONNX; its trained weights are)"),
        (Int8Dynamic, "onnx_int8_weights", "onnxruntime quantize_dynamic (7-bit int8 weights per "
         "channel, activation outliers smoothed into them on training samples) of the torch.onnx "
         "float graph, activation ranges computed at run time"),
        (Int8WeightOnly, "onnx_int8_weights", "onnxruntime weight-only int8 (DequantizeLinear "
         "per weight, per channel) of the torch.onnx float graph, float compute"),
    ),
    "tflite": tuple((scheme, function, made_by + TFLITE_BATCH) for scheme, function, made_by in (
        (Float32, "tflite_float32", "litert-torch converter, float32"),
        (Float16, "tflite_float16", "litert-torch converter, float16 weights by "
                                    "ai-edge-quantizer (a DEQUANTIZE per weight), float32 I/O"),
        (Int8Static, "tflite_int8_static", "torchao PT2E (XNNPACK quantizer), ranges calibrated "
                                           "on training samples, litert-torch converter"),
        (Int8Qat, "tflite_int8_static", "torchao PT2E QAT, the learned fake-quant ranges, "
                                        "litert-torch converter"),
        (Int8Dynamic, "tflite_int8_weights", "litert-torch converter, ai-edge-quantizer dynamic "
         "int8 (int8 weights per channel), activation ranges computed at run time"),
        (Int8WeightOnly, "tflite_int8_weights", "litert-torch converter, ai-edge-quantizer "
         "weight-only int8 (a DEQUANTIZE per weight), float compute"),
    )),
}
EXAMPLE_ROWS = {"onnx": ONNX_EXAMPLE_ROWS, "tflite": TFLITE_EXAMPLE_ROWS}


def _converter(fmt: str, function: str):
    """The export handler calling `function(state, scheme, path, ctx, example)` of
    compressor/backends/torch/<fmt>.py (imported when it runs: it imports torch)."""
    def write(backend: Any, state: ModelState, scheme: Scheme, path: Path, ctx: Context) -> Path:
        module = importlib.import_module(f"compressor.backends.torch.{fmt}")
        return getattr(module, function)(state, scheme, path, ctx, _example(ctx, EXAMPLE_ROWS[fmt]))

    return write


for _fmt, _routes in EXPORTS.items():
    for _scheme, _function, _made_by in _routes:
        export_handler(_scheme, KIND, _fmt, made_by=_made_by)(_converter(_fmt, _function))

"""PyTorch model state -> .onnx with torch.onnx's dynamo exporter (dynamic batch dimension).

- float32: the model as it is.
- float16: the float32 graph through the shared onnxconverter-common helper (float32 I/O).
- int8: the PT2E graph without its observers / fake-quant modules (calibrated or QAT-trained
  float weights) exported as float32, then quantized by onnxruntime's static QDQ quantizer
  on our calibration samples (export/onnx_int8.py): Q/DQ only where onnxruntime fuses them
  into int8 kernels. (Exporting the converted PT2E graph gave Q/DQ chains around every op
  that onnxruntime ran no faster than float.)
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from compressor.backends.torch.env import import_onnx
from compressor.backends.torch.io import as_tensors, exportable
from compressor.backends.torch.quant import float_graph
from compressor.backends.torch.train import set_mode
from compressor.errors import BackendUnavailableError, first_line
from compressor.export.onnx import float16_onnx, save_checked_onnx
from compressor.quiet import captured_native_output, log_tail
from compressor.steps import PrecisionConfig, QuantizeConfig

if TYPE_CHECKING:
    from compressor.context import Context, ModelState
    from compressor.tensors import Arrays

EXPORT_ERRORS = (RuntimeError, TypeError, ValueError, NotImplementedError, KeyError,
                 AttributeError)


def onnx_from_torch(state: ModelState, path: Path, ctx: Context, example: Arrays) -> Path:
    import_onnx()   # a typed error naming the package when onnx / onnxscript are missing
    log = Path(ctx.workdir) / "logs" / "onnx-export.log"
    quantize, precision = state.last(QuantizeConfig), state.last(PrecisionConfig)
    if quantize is not None and quantize.mode in ("ptq", "qat"):
        module = float_graph(state.model)
    else:   # float, or dynamic / weight_only int8 (made from the float graph)
        module = state.model
        set_mode(module, training=False)
    proto = _exported_proto(module, example, log, "float32", ctx)
    if quantize is not None:
        from compressor.backends.training_data import calibration_samples
        from compressor.export.onnx_int8 import int8_onnx_from_float

        # Before stripping: float_layers match the module paths in the node metadata.
        proto = int8_onnx_from_float(
            proto, lambda: calibration_samples(ctx, quantize.calibration_samples),
            state.float_layers, quantize.fallback_dtype, Path(ctx.workdir), quantize.mode)
    if precision is not None and quantize is None:
        # Before stripping: `exclude` patterns match the module paths in the node metadata.
        proto = float16_onnx(proto, precision)
    _strip_debug_metadata(proto)
    return save_checked_onnx(proto, path, log)


def _exported_proto(module: torch.nn.Module, example: Arrays, log: Path, kind: str,
                    ctx: Context) -> Any:
    """The ONNX graph with the original model's input and output names, batch dynamic."""
    input_names = [spec.name for spec in ctx.inputs] or ["input"]
    tensors = as_tensors(module, example, input_names)
    module = exportable(module, tensors, input_names)
    try:
        with captured_native_output(log, f"ONNX {kind}"):
            program = torch.onnx.export(
                module, tuple(tensors), dynamo=True, verbose=False,
                input_names=input_names[:len(tensors)],
                output_names=[spec.name for spec in ctx.outputs] or ["output"],
                dynamic_shapes=tuple({0: torch.export.Dim.DYNAMIC} for _ in tensors))
    except EXPORT_ERRORS as exc:
        raise BackendUnavailableError(
            f"ONNX {kind} export failed: {first_line(exc)}\n{log_tail(log)}\n(full log: {log}); "
            "an op torch.export or the ONNX exporter does not support is the usual cause: "
            "replace it, or export tflite only") from None
    return program.model_proto


def _strip_debug_metadata(proto: Any) -> None:
    """The exporter stores a stack trace and module path on every node (~40% of a small file)."""
    for node in proto.graph.node:
        del node.metadata_props[:]
        node.doc_string = ""
    proto.graph.doc_string = ""

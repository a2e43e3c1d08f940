"""PyTorch model state -> .onnx with torch.onnx's dynamo exporter (dynamic batch dimension),
one function per scheme (the handlers in handlers.py call them):

- float32: the model as it is.
- float16: the float32 graph through the shared float16 helper (float32 I/O).
- int8: the float32 graph quantized by onnxruntime (export/onnx_int8.py). For static int8
  (ptq, qat) that graph is the PT2E graph without its observers / fake-quant modules
  (calibrated or QAT-trained float weights), quantized by onnxruntime's static QDQ quantizer
  on our calibration samples: Q/DQ only where onnxruntime fuses them into int8 kernels.
  (Exporting the converted PT2E graph gave Q/DQ chains around every op that onnxruntime ran
  no faster than float.) dynamic / weight_only quantize the float model's graph.
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
from compressor.core.quiet import captured_native_output, log_tail

if TYPE_CHECKING:
    from compressor.core.context import Context, ModelState
    from compressor.schemes import Float16, Float32, Int8Scheme
    from compressor.core.tensors import Arrays

EXPORT_ERRORS = (RuntimeError, TypeError, ValueError, NotImplementedError, KeyError,
                 AttributeError)


def onnx_float32(state: ModelState, scheme: Float32, path: Path, ctx: Context,
                 example: Arrays) -> Path:
    import_onnx()   # a typed error naming the package when onnx / onnxscript are missing
    log = _log(ctx)
    proto = _exported_proto(_float_model(state), example, log, "float32", ctx)
    return _saved(proto, path, log)


def onnx_float16(state: ModelState, scheme: Float16, path: Path, ctx: Context,
                 example: Arrays) -> Path:
    import_onnx()
    log = _log(ctx)
    proto = _exported_proto(_float_model(state), example, log, "float32", ctx)
    # Before stripping: `exclude` patterns match the module paths in the node metadata.
    return _saved(float16_onnx(proto, scheme), path, log)


def onnx_int8_static(state: ModelState, scheme: Int8Scheme, path: Path, ctx: Context,
                     example: Arrays) -> Path:
    """ptq / qat: the prepared PT2E graph's float weights, quantized by onnxruntime."""
    import_onnx()
    return _int8(float_graph(state.model), state, scheme, path, ctx, example)


def onnx_int8_weights(state: ModelState, scheme: Int8Scheme, path: Path, ctx: Context,
                      example: Arrays) -> Path:
    """dynamic / weight_only: the float model's graph with int8 weights by onnxruntime."""
    import_onnx()
    return _int8(_float_model(state), state, scheme, path, ctx, example)


def _int8(module: torch.nn.Module, state: ModelState, scheme: Int8Scheme, path: Path,
          ctx: Context, example: Arrays) -> Path:
    from compressor.backends.training_data import calibration_samples
    from compressor.export.onnx_int8 import int8_onnx_from_float

    log = _log(ctx)
    proto = _exported_proto(module, example, log, "float32", ctx)
    # Before stripping: float_layers match the module paths in the node metadata.
    proto = int8_onnx_from_float(
        proto, lambda: calibration_samples(ctx, scheme.calibration_samples),
        state.float_layers, scheme.fallback_dtype, Path(ctx.workdir), scheme.method,
        record=ctx.record)
    return _saved(proto, path, log)


def _float_model(state: ModelState) -> torch.nn.Module:
    set_mode(state.model, training=False)
    return state.model


def _log(ctx: Context) -> Path:
    return Path(ctx.workdir) / "logs" / "onnx-export.log"


def _saved(proto: Any, path: Path, log: Path) -> Path:
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

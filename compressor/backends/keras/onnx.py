"""tf_keras model -> .onnx (opset 17, dynamic batch dimension, checked by onnx.checker).

- float32: tf2onnx straight from the Keras model.
- float16: the float32 graph converted by onnxconverter-common, float32 I/O kept by default.
- int8: tf2onnx's TFLite front end on the full-int8, float-I/O TFLite. Converting the QAT
  Keras model instead keeps float32 weights behind Q/DQ nodes, which is not an int8 model;
  from the TFLite, conv / dense weights become int8 initializers (a QDQ model).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from compressor.backends.keras.env import import_tensorflow
from compressor.backends.keras.io import original_names
from compressor.backends.keras.tflite import ConversionCache, int8_tflite
from compressor.errors import BackendUnavailableError, first_line
from compressor.export.int8 import require_int8_kernels
from compressor.export.onnx import (float16_onnx, renamed_io, require_dynamic_batch,
                                    save_checked_onnx)
from compressor.export.tflite import signature_names
from compressor.quiet import captured_native_output, log_tail
from compressor.steps import PrecisionConfig, QuantizeConfig

if TYPE_CHECKING:
    from compressor.context import Context, ModelState

OPSET = 17
STANDARD_DOMAINS = ("", "ai.onnx", "com.microsoft")


def onnx_from_keras(state: ModelState, path: Path, ctx: Context, cache: ConversionCache) -> Path:
    log = Path(ctx.workdir) / "logs" / "onnx-convert.log"
    quantize, precision = state.last(QuantizeConfig), state.last(PrecisionConfig)
    if quantize is not None:
        proto = _int8_onnx(state, ctx, cache, log)
        if state.float_layers:
            from compressor.export.onnx_mixed import keep_float_kernels

            keep_float_kernels(proto, quantize.fallback_dtype)
    else:
        proto = _float_onnx(state.model, log)
        renamed_io(proto, original_names(state.model, ctx))
        if precision is not None:
            proto = float16_onnx(proto, precision)
    require_dynamic_batch(proto)
    return save_checked_onnx(proto, path, log)


def _float_onnx(model: Any, log: Path) -> Any:
    tf = import_tensorflow()
    # A None batch dimension in the signature makes the ONNX batch dimension dynamic.
    signature = [tf.TensorSpec((None, *tensor.shape[1:]), tensor.dtype,
                               name=tensor.name.split(":")[0]) for tensor in model.inputs]
    return _tf2onnx(log, "float32", lambda tf2onnx: tf2onnx.convert.from_keras(
        model, input_signature=signature, opset=OPSET))


def _int8_onnx(state: ModelState, ctx: Context, cache: ConversionCache, log: Path) -> Any:
    tflite_path = Path(ctx.workdir) / "int8-float-io.tflite"
    tflite_path.parent.mkdir(parents=True, exist_ok=True)
    content = int8_tflite(state, ctx, cache, io_dtype="float32")
    tflite_path.write_bytes(content)
    # The TFLite this ONNX is made from must compute in int8 too: a hybrid (float activation)
    # TFLite would still give int8 ONNX weights, which the ONNX read-back cannot tell apart.
    quantize = state.last(QuantizeConfig)
    require_int8_kernels(tflite_path, quantize.mode, len(state.float_layers))
    # Not `dequantize`: that would turn the int8 weights back into float32.
    proto = _tf2onnx(log, "int8", lambda tf2onnx: tf2onnx.convert.from_tflite(
        str(tflite_path), opset=OPSET))
    # the original Keras model's input / output names
    renames = original_names(state.model, ctx)
    renamed_io(proto, {tensor: renames.get(name, name)
                       for tensor, name in signature_names(content).items()})
    return proto


def _tf2onnx(log: Path, kind: str, convert) -> Any:
    import_tensorflow()   # with the environment tf2onnx's own TensorFlow import needs
    try:
        with captured_native_output(log, f"ONNX {kind}"):
            import tf2onnx

            proto, _ = convert(tf2onnx)
    except (ValueError, KeyError, TypeError, RuntimeError, NotImplementedError,
            AttributeError) as exc:
        raise BackendUnavailableError(
            f"ONNX {kind} conversion failed: {first_line(exc)}\n{log_tail(log)}\n"
            f"(full log: {log}); a layer tf2onnx does not support is the usual cause: replace "
            "it, or export tflite only") from None
    unsupported = sorted({node.op_type for node in proto.graph.node
                          if node.domain not in STANDARD_DOMAINS or node.op_type.startswith("TFL_")})
    if unsupported:
        raise BackendUnavailableError(f"tf2onnx left ops ONNX runtimes cannot run: "
                                      f"{', '.join(unsupported)}; export tflite only")
    return proto

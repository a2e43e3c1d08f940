"""tf_keras model -> .onnx (opset 17, dynamic batch dimension, checked by onnx.checker).

- float32: tf2onnx straight from the Keras model.
- float16: the float32 graph converted by onnxconverter-common, float32 I/O kept by default.
- int8: the float model (ptq) or the QAT model's float layers with their trained weights
  (qat) through tf2onnx as float32, then onnxruntime's static QDQ quantizer on our
  calibration samples (export/onnx_int8.py): Q/DQ only where onnxruntime fuses them into
  int8 kernels. (tf2onnx on the int8 TFLite gave DequantizeLinear -> QuantizeLinear chains
  around most ops, up to 4x slower than float; on the QAT model it keeps float weights.)
  dynamic / weight_only: onnxruntime's own modes on the float32 graph.

One function per scheme; keras/handlers.py registers them.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from compressor.backends.keras.env import import_tensorflow
from compressor.backends.keras.io import original_names
from compressor.errors import BackendUnavailableError, converter_failure
from compressor.export.onnx import (float16_onnx, renamed_io, require_dynamic_batch,
                                    save_checked_onnx)
from compressor.core.quiet import captured_native_output

if TYPE_CHECKING:
    from collections.abc import Callable

    from compressor.core.context import Context
    from compressor.export.onnx_ranges import LearnedRanges
    from compressor.schemes import Float16, Int8Scheme

OPSET = 17
STANDARD_DOMAINS = ("", "ai.onnx", "com.microsoft")


def onnx_float32(model: Any, path: Path, ctx: Context) -> Path:
    return _save(_named_float_onnx(model, ctx), path, ctx)


def onnx_float16(model: Any, scheme: Float16, path: Path, ctx: Context) -> Path:
    return _save(float16_onnx(_named_float_onnx(model, ctx), scheme), path, ctx)


def onnx_int8(model: Any, scheme: Int8Scheme, float_layers: tuple[str, ...], path: Path,
              ctx: Context, learned: Callable[[], LearnedRanges] | None = None) -> Path:
    """onnxruntime's int8 (export/onnx_int8.py) in the scheme's mode of the float `model`
    (for qat: the QAT model's float layers with their trained weights, and `learned()`: the
    activation ranges QAT learned)."""
    from compressor.backends.training_data import calibration_samples
    from compressor.export.onnx_int8 import int8_onnx_from_float

    proto = int8_onnx_from_float(
        _named_float_onnx(model, ctx), lambda: calibration_samples(ctx, scheme.calibration_samples),
        float_layers, scheme.fallback_dtype, Path(ctx.workdir), scheme.method, learned,
        record=ctx.record)
    return _save(proto, path, ctx)


def _named_float_onnx(model: Any, ctx: Context) -> Any:
    """tf2onnx's float32 graph of `model`, with the original model's I/O names."""
    proto = _float_onnx(model, _log(ctx))
    renamed_io(proto, original_names(model, ctx))
    return proto


def _save(proto: Any, path: Path, ctx: Context) -> Path:
    require_dynamic_batch(proto)
    return save_checked_onnx(proto, path, _log(ctx))


def _log(ctx: Context) -> Path:
    return Path(ctx.workdir) / "logs" / "onnx-convert.log"


def _float_onnx(model: Any, log: Path) -> Any:
    tf = import_tensorflow()
    # A None batch dimension in the signature makes the ONNX batch dimension dynamic.
    signature = [tf.TensorSpec((None, *tensor.shape[1:]), tensor.dtype,
                               name=tensor.name.split(":")[0]) for tensor in model.inputs]
    return _tf2onnx(log, "float32", lambda tf2onnx: tf2onnx.convert.from_keras(
        model, input_signature=signature, opset=OPSET,
        custom_op_handlers={"Erfc": (_erfc_as_erf, [])}))


def _erfc_as_erf(graph: Any, node: Any, name: str, args: list) -> Any:
    """tf2onnx has no Erfc, which Keras' exact GELU uses (0.5 x erfc(-x / sqrt 2)): write it
    as 1 - Erf(x), both standard ONNX ops."""
    import numpy as np
    from tf2onnx import utils

    node.type = "Erf"
    dtype = utils.map_onnx_to_numpy_type(graph.get_dtype(node.output[0]))
    one = graph.make_const(utils.make_name(f"{name}_one"), np.array(1, dtype=dtype))
    minus = graph.insert_new_node_on_output("Sub", node.output[0], name=utils.make_name(name))
    graph.replace_inputs(minus, [one.output[0], node.output[0]])
    return node


def _tf2onnx(log: Path, kind: str, convert) -> Any:
    import_tensorflow()   # with the environment tf2onnx's own TensorFlow import needs
    try:
        with captured_native_output(log, f"ONNX {kind}"):
            import tf2onnx

            proto, _ = convert(tf2onnx)
    except (ValueError, KeyError, TypeError, RuntimeError, NotImplementedError,
            AttributeError) as exc:
        raise BackendUnavailableError(converter_failure(
            f"ONNX {kind} conversion", exc, "replace the unsupported layer or export tflite "
            "only", log)) from None
    unsupported = sorted({node.op_type for node in proto.graph.node
                          if node.domain not in STANDARD_DOMAINS or node.op_type.startswith("TFL_")})
    if unsupported:
        more = f" and {len(unsupported) - 8} more" if len(unsupported) > 8 else ""
        raise BackendUnavailableError(f"tf2onnx left ops ONNX runtimes cannot run: "
                                      f"{', '.join(unsupported[:8])}{more}; export tflite only")
    _number_unknown_dims(proto)
    return proto


def _number_unknown_dims(proto: Any) -> None:
    """tf2onnx names unknown dims `unk__<n>` from a process-wide counter, so the same model
    gave different bytes after earlier conversions in the process (a serial sweep vs a Ray
    worker); number them from 0 in graph order instead."""
    import re

    names: dict[str, str] = {}
    values = [*proto.graph.input, *proto.graph.output, *proto.graph.value_info]
    for value in values:
        for dim in value.type.tensor_type.shape.dim:
            if re.fullmatch(r"unk__\d+", dim.dim_param):
                dim.dim_param = names.setdefault(dim.dim_param, f"unk__{len(names)}")

"""tf_keras model -> .onnx (opset 17, dynamic batch dimension, checked by onnx.checker).

- float32: tf2onnx straight from the Keras model.
- float16: the float32 graph converted by onnxconverter-common, float32 I/O kept by default.
- int8: tf2onnx's TFLite front end on the full-int8, float-I/O TFLite. Converting the QAT
  Keras model instead keeps float32 weights behind Q/DQ nodes, which is not an int8 model;
  from the TFLite, conv / dense weights become int8 initializers (a QDQ model).
"""
from __future__ import annotations

import copy
import fnmatch
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compressor.backends.keras_env import import_tensorflow
from compressor.errors import BackendUnavailableError, RecipeError
from compressor.export.quiet import captured_native_output, log_tail

if TYPE_CHECKING:
    from compressor.context import Context, ModelState

OPSET = 17
KERNEL_OPS = {"Conv": 1, "ConvTranspose": 1, "MatMul": 1, "Gemm": 1}
STANDARD_DOMAINS = ("", "ai.onnx", "com.microsoft")


def onnx_from_keras(state: ModelState, path: Path, ctx: Context) -> Path:
    log = Path(ctx.workdir) / "logs" / "onnx-convert.log"
    if state.quantize is not None:
        proto = _int8_onnx(state, ctx, log)
        _require_int8_kernels(proto, allowed_float=len(state.float_layers))
        if state.float_layers:
            from compressor.export.onnx_mixed import keep_float_kernels

            keep_float_kernels(proto, state.quantize.fallback_dtype)
    else:
        proto = _float_onnx(state.model, log)
        if state.precision is not None:
            proto = float16_onnx(proto, state.precision)
    _require_dynamic_batch(proto)
    return save_checked_onnx(proto, path, log)


def save_checked_onnx(proto: Any, path: Path, log: Path) -> Path:
    """onnx.checker first, so an invalid graph is a typed error and never written."""
    import onnx

    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as exc:
        raise BackendUnavailableError(f"the exported ONNX model is invalid ({_first_line(exc)}); "
                                      f"see {log}, or export tflite only") from None
    onnx.save(proto, str(path))
    return path


def _float_onnx(model: Any, log: Path) -> Any:
    tf = import_tensorflow()
    # A None batch dimension in the signature makes the ONNX batch dimension dynamic.
    signature = [tf.TensorSpec((None, *tensor.shape[1:]), tensor.dtype,
                               name=tensor.name.split(":")[0]) for tensor in model.inputs]
    return _tf2onnx(log, "float32", lambda tf2onnx: tf2onnx.convert.from_keras(
        model, input_signature=signature, opset=OPSET))


def _int8_onnx(state: ModelState, ctx: Context, log: Path) -> Any:
    from compressor.export.tflite import int8_tflite

    tflite_path = Path(ctx.workdir) / "int8-float-io.tflite"
    tflite_path.parent.mkdir(parents=True, exist_ok=True)
    tflite_path.write_bytes(int8_tflite(state, ctx, io_dtype="float32"))
    # Not `dequantize`: that would turn the int8 weights back into float32.
    return _tf2onnx(log, "int8", lambda tf2onnx: tf2onnx.convert.from_tflite(
        str(tflite_path), opset=OPSET))


def _tf2onnx(log: Path, kind: str, convert) -> Any:
    import_tensorflow()   # with the environment tf2onnx's own TensorFlow import needs
    try:
        with captured_native_output(log, f"ONNX {kind}"):
            import tf2onnx

            proto, _ = convert(tf2onnx)
    except (ValueError, KeyError, TypeError, RuntimeError, NotImplementedError,
            AttributeError) as exc:
        raise BackendUnavailableError(
            f"ONNX {kind} conversion failed: {_first_line(exc)}\n{log_tail(log)}\n"
            f"(full log: {log}); a layer tf2onnx does not support is the usual cause: replace "
            "it, or export tflite only") from None
    unsupported = sorted({node.op_type for node in proto.graph.node
                          if node.domain not in STANDARD_DOMAINS or node.op_type.startswith("TFL_")})
    if unsupported:
        raise BackendUnavailableError(f"tf2onnx left ops ONNX runtimes cannot run: "
                                      f"{', '.join(unsupported)}; export tflite only")
    return proto


def float16_onnx(proto: Any, precision: Any) -> Any:
    from onnxconverter_common import float16

    matched = {pattern: [node.name for node in proto.graph.node if _names_layer(node, pattern)]
               for pattern in precision.exclude}
    unmatched = [pattern for pattern, nodes in matched.items() if not nodes]
    if unmatched:
        raise RecipeError(f"precision exclude pattern(s) {', '.join(map(repr, unmatched))} match "
                          "no node of the ONNX model; patterns match layer names (e.g. "
                          "'dense_1', 'conv*'), PyTorch module paths ('head.3') or node names")
    blocked = sorted({name for nodes in matched.values() for name in nodes})
    # Copies of the float32 weights before conversion, for the excluded layers (see below).
    originals = {init.name: copy.deepcopy(init) for init in proto.graph.initializer} \
        if blocked else {}
    # onnxconverter-common keeps its default op block list (ops without float16 kernels) too.
    converted = float16.convert_float_to_float16(proto, keep_io_types=precision.keep_io_types,
                                                 node_block_list=blocked or None)
    if blocked:
        from compressor.export.onnx_mixed import restore_float32_weights

        restore_float32_weights(converted, originals, set(blocked))
    return converted


def _names_layer(node: Any, pattern: str) -> bool:
    """A node belongs to a layer if its whole name matches, or a part of its `model/layer/op`
    path (tf2onnx; fused names joined by ';'), or a module path torch.onnx recorded for it
    (e.g. 'head.3')."""
    import ast

    parts = [part for path in node.name.split(";") for part in path.split("/")]
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes" and prop.value.startswith("["):
            parts += [str(scope) for scope in ast.literal_eval(prop.value)]
    return fnmatch.fnmatch(node.name, pattern) or any(fnmatch.fnmatch(p, pattern) for p in parts)


def _require_int8_kernels(proto: Any, allowed_float: int = 0) -> None:
    """Every conv / matmul weight must be an int8 initializer behind a DequantizeLinear, but
    for `allowed_float` kernels of layers the quantize fallback keeps float."""
    initializers = {init.name: init for init in proto.graph.initializer}
    producers = {out: node for node in proto.graph.node for out in node.output}
    float_kernels = []
    for node in proto.graph.node:
        weight_index = KERNEL_OPS.get(node.op_type)
        if weight_index is None or len(node.input) <= weight_index:
            continue
        weight = node.input[weight_index]
        source = producers.get(weight)
        if source is not None and source.op_type == "DequantizeLinear":
            weight = source.input[0]
        if weight in initializers and initializers[weight].data_type != _int8_type():
            float_kernels.append(node.name or node.op_type)
    if len(float_kernels) > allowed_float:
        raise BackendUnavailableError(f"the int8 ONNX kept float weights in "
                                      f"{', '.join(float_kernels[:5])}; export tflite only")


def _require_dynamic_batch(proto: Any) -> None:
    for value in proto.graph.input:
        dims = value.type.tensor_type.shape.dim
        if dims and dims[0].HasField("dim_value"):
            raise BackendUnavailableError(f"the ONNX input {value.name!r} has a fixed batch size "
                                          f"{dims[0].dim_value}; give the model a None batch "
                                          "dimension (keras.Input(shape=...)) and export again")


def _int8_type() -> int:
    import onnx

    return onnx.TensorProto.INT8


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:240]

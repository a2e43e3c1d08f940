"""Mixed int8 / float TFLite: int8 everywhere except chosen layers (quantize fallback: auto).

The converter calibrates the model once (`_experimental_calibrate_only`); TensorFlow's MLIR
quantizer then quantizes the calibrated model with the chosen layers' ops on its deny list,
the route `tf.lite.experimental.QuantizationDebugger` uses for selective quantization.
Calibrating once makes each candidate of the fallback search cost one quick re-quantization.

Denied ops stay float32: the quantizer has no float16 option. For float16, their weights are
then stored as float16 behind a DEQUANTIZE op (`float16_weights`), the form the converter's
own float16 models have, which LiteRT / XNNPACK load as float32 weights.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from compressor.errors import BackendUnavailableError

if TYPE_CHECKING:
    from compressor.context import Context, ModelState

CALIBRATED_CACHE_KEY = "keras.calibrated_tflite"
KERNEL_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "TRANSPOSE_CONV")
KERNEL_LAYER_ATTRS = ("kernel", "depthwise_kernel")


def kernel_layer_names(model: Any) -> list[str]:
    """Names of the layers with a conv / dense kernel (what int8 quantizes), in model order."""
    names = []
    for layer in model.layers:
        if hasattr(layer, "layers"):           # a nested model: its own layers
            names += kernel_layer_names(layer)
        elif any(getattr(layer, attr, None) is not None for attr in KERNEL_LAYER_ATTRS):
            names.append(layer.name)
    return names


def layer_of(tensor_name: str, layers: tuple[str, ...] | list[str]) -> str | None:
    """The Keras layer a TFLite tensor comes from: tensor names are `model/layer/op` paths,
    several joined by ';' when the converter fused ops."""
    parts = {part for path in tensor_name.split(";") for part in path.split("/")}
    return next((layer for layer in layers if layer in parts), None)


def mixed_int8_tflite(state: ModelState, ctx: Context, io_dtype: str,
                      calibrate: Callable[[], bytes]) -> bytes:
    """int8 TFLite of a ptq `state` with `state.float_layers` left float."""
    from tensorflow.lite.python import convert

    from compressor.backends.keras_env import import_tensorflow
    from compressor.export.quiet import captured_native_output

    tf = import_tensorflow()
    calibrated = _cached_calibration(state, ctx, calibrate)
    denied = _float_layer_nodes(calibrated, state.float_layers)
    int8_io = io_dtype == "int8"
    log = ctx.workdir / "logs" / "tflite-quantize.log"
    try:
        with captured_native_output(log, "TFLite int8 with float layers"):
            content = convert.mlir_quantize(
                calibrated, fully_quantize=int8_io,
                input_data_type=tf.int8 if int8_io else tf.float32,
                output_data_type=tf.int8 if int8_io else tf.float32,
                denylisted_nodes=denied or None)
    except (ValueError, RuntimeError, TypeError) as exc:
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:240]
        raise BackendUnavailableError(f"TFLite int8 quantization with float layers failed "
                                      f"({first_line}); set fallback: none") from None
    if state.float_layers and state.quantize.fallback_dtype == "float16":
        content = float16_weights(content,
                                  lambda weight: layer_of(weight, state.float_layers) is not None)
    return bytes(content)


def _cached_calibration(state: ModelState, ctx: Context, calibrate: Callable[[], bytes]) -> bytes:
    key = (id(state.model), state.quantize.calibration_samples, ctx.seed)
    cached = ctx.extras.get(CALIBRATED_CACHE_KEY)
    if cached is None or cached[0] != key or cached[1] is not state.model:
        cached = (key, state.model, calibrate())
        ctx.extras[CALIBRATED_CACHE_KEY] = cached
    return cached[2]


def _float_layer_nodes(calibrated: bytes, float_layers: tuple[str, ...]) -> list[str]:
    """Output tensor names (what the quantizer's deny list matches) of the float layers' ops."""
    nodes, found = [], set()
    for _op_name, output, weight in _kernel_ops(calibrated):
        layer = layer_of(weight, float_layers)
        if layer is not None:
            nodes.append(output)
            found.add(layer)
    missing = [layer for layer in float_layers if layer not in found]
    if missing:
        raise BackendUnavailableError(f"no conv / dense op of layer(s) {', '.join(missing)} was "
                                      "found in the converted model, so they cannot be kept "
                                      "float; set fallback: none")
    return nodes


def _kernel_ops(content: bytes) -> list[tuple[str, str, str]]:
    """(op name, output tensor name, weight tensor name) of every conv / dense op."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    interpreter = Interpreter(model_content=content, experimental_op_resolver_type=(
        OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES))
    names = {t["index"]: t["name"] for t in interpreter.get_tensor_details()}
    return [(op["op_name"], names[op["outputs"][0]], names[op["inputs"][1]])
            for op in interpreter._get_ops_details() if op["op_name"] in KERNEL_OPS]


def float16_weights(content: bytes, chosen: Callable[[str], bool]) -> bytes:
    """Store the float32 weights of the conv / dense ops `chosen(weight tensor name)` picks as
    float16, each behind a DEQUANTIZE op that restores float32 at load time."""
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model_from_bytearray(bytearray(content))
    dequantize = _opcode_index(model, schema.BuiltinOperator.DEQUANTIZE, schema)
    for graph in model.subgraphs:
        operators = []
        for op in graph.operators:
            name = flatbuffer_utils.opcode_to_name(model, op.opcodeIndex)
            if name in KERNEL_OPS and chosen(graph.tensors[op.inputs[1]].name.decode()):
                operators += _float16_weight(model, graph, op, dequantize, schema)
            operators.append(op)
        graph.operators = operators
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def _float16_weight(model: Any, graph: Any, op: Any, dequantize: int, schema: Any) -> list:
    weight = graph.tensors[op.inputs[1]]
    buffer = model.buffers[weight.buffer]
    if weight.type != schema.TensorType.FLOAT32 or buffer.data is None or not len(buffer.data):
        return []                             # not a float32 constant: nothing to store as fp16
    values = np.frombuffer(bytes(bytearray(buffer.data)), dtype=np.float32)
    half = schema.TensorT()
    half.name, half.shape, half.type = weight.name + b"_fp16", list(weight.shape), \
        schema.TensorType.FLOAT16
    stored = schema.BufferT()
    stored.data = np.frombuffer(values.astype(np.float16).tobytes(), dtype=np.uint8)
    model.buffers.append(stored)
    half.buffer = len(model.buffers) - 1
    graph.tensors.append(half)
    if sum(t.buffer == weight.buffer for g in model.subgraphs for t in g.tensors) == 1:
        buffer.data = None                    # the float32 copy is no longer stored
    weight.buffer = 0                         # now computed by the DEQUANTIZE (buffer 0 = empty)
    restore = schema.OperatorT()
    restore.opcodeIndex, restore.inputs, restore.outputs = dequantize, [len(graph.tensors) - 1], \
        [op.inputs[1]]
    return [restore]


def _opcode_index(model: Any, builtin: int, schema: Any) -> int:
    for index, code in enumerate(model.operatorCodes):
        if max(code.builtinCode, code.deprecatedBuiltinCode) == builtin:
            return index
    code = schema.OperatorCodeT()
    code.builtinCode, code.deprecatedBuiltinCode, code.version = builtin, min(builtin, 127), 1
    model.operatorCodes.append(code)
    return len(model.operatorCodes) - 1

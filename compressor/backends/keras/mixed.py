"""Mixed int8 / float TFLite from a Keras model: int8 everywhere except chosen layers
(quantize fallback: auto).

The converter calibrates the model once (`_experimental_calibrate_only`, cached by the
caller); TensorFlow's MLIR quantizer then quantizes the calibrated model with the chosen
layers' ops on its deny list, the route `tf.lite.experimental.QuantizationDebugger` uses for
selective quantization. Calibrating once makes each candidate of the fallback search cost
one quick re-quantization.

Denied ops stay float32: the quantizer has no float16 option. For float16, their weights are
then stored as float16 (export/tflite.py `float16_weights`).
"""
from __future__ import annotations

import glob
from typing import TYPE_CHECKING, Any

from compressor.backends.keras.env import import_tensorflow
from compressor.errors import BackendUnavailableError, first_line
from compressor.export.tflite import float16_weights
from compressor.core.kernel_ops import TFLITE_KERNEL_INPUTS
from compressor.core.quiet import captured_native_output
from compressor.core.tensor_names import in_layer

if TYPE_CHECKING:
    from compressor.core.context import Context, ModelState
    from compressor.schemes import Int8Scheme

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
    """The layer of `layers` a TFLite tensor comes from (tensor_names.in_layer; where one
    layer's name starts another's, "a" and "a/b", the longest wins), so pass every kernel
    layer and compare the result."""
    found = [layer for layer in layers if in_layer(tensor_name, glob.escape(layer))]
    return max(found, key=len, default=None)


def mixed_int8_tflite(state: ModelState, scheme: Int8Scheme, ctx: Context,
                      calibrated: bytes) -> bytes:
    """int8 TFLite of a calibrated ptq model with `state.float_layers` left float (in the
    scheme's `fallback_dtype`), with the scheme's `io_dtype`."""
    from tensorflow.lite.python import convert

    tf = import_tensorflow()
    kernels = kernel_layer_names(state.model)
    denied = _float_layer_nodes(calibrated, state.float_layers, kernels)
    int8_io = scheme.io_dtype == "int8"
    log = ctx.workdir / "logs" / "tflite-quantize.log"
    try:
        with captured_native_output(log, "TFLite int8 with float layers"):
            content = convert.mlir_quantize(
                calibrated, fully_quantize=int8_io,
                input_data_type=tf.int8 if int8_io else tf.float32,
                output_data_type=tf.int8 if int8_io else tf.float32,
                denylisted_nodes=denied or None)
    except (ValueError, RuntimeError, TypeError) as exc:
        raise BackendUnavailableError(f"TFLite int8 quantization with float layers failed "
                                      f"({first_line(exc)}); set fallback: none") from None
    if state.float_layers and scheme.fallback_dtype == "float16":
        content = float16_weights(
            content, lambda weight: layer_of(weight, kernels) in state.float_layers)
    return bytes(content)


def _float_layer_nodes(calibrated: bytes, float_layers: tuple[str, ...],
                       kernels: list[str]) -> list[str]:
    """Output tensor names (what the quantizer's deny list matches) of the float layers' ops
    (`kernels`: every kernel layer, which tells "Conv" from ".../squeeze_excite/Conv")."""
    nodes, found = [], set()
    for output, weight in _kernel_ops(calibrated):
        layer = layer_of(weight, kernels)
        if layer in float_layers:
            nodes.append(output)
            found.add(layer)
    missing = [layer for layer in float_layers if layer not in found]
    if missing:
        raise BackendUnavailableError(f"no conv / dense op of layer(s) {', '.join(missing)} was "
                                      "found in the converted model, so they cannot be kept "
                                      "float; set fallback: none")
    return nodes


def _kernel_ops(content: bytes) -> list[tuple[str, str]]:
    """(output tensor name, weight tensor name) of every conv / dense op."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    interpreter = Interpreter(model_content=content, experimental_op_resolver_type=(
        OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES))
    names = {t["index"]: t["name"] for t in interpreter.get_tensor_details()}
    return [(names[op["outputs"][0]], names[op["inputs"][TFLITE_KERNEL_INPUTS[op["op_name"]][-1]]])
            for op in interpreter._get_ops_details() if op["op_name"] in TFLITE_KERNEL_INPUTS]

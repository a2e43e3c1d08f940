"""tf_keras model -> .tflite: float32, float16 weights, or full int8 (QAT or calibrated PTQ).

Full int8 means int8 weights AND int8 activations in every conv / dense op; a converter
result that silently keeps float compute is refused rather than shipped as "int8".
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from compressor.backends.keras_env import import_tensorflow
from compressor.errors import BackendUnavailableError, DataError, RecipeError
from compressor.export.quiet import captured_native_output, log_tail

if TYPE_CHECKING:
    from compressor.context import Context, ModelState

KERNEL_OPS = {"CONV_2D": 1, "DEPTHWISE_CONV_2D": 1, "FULLY_CONNECTED": 1, "TRANSPOSE_CONV": 1}
INT8_CACHE_KEY = "keras.int8_tflite"   # ctx.extras: the float-I/O int8 model, reused by ONNX


def tflite_from_keras(state: ModelState, path: Path, ctx: Context) -> Path:
    if state.quantize is not None:
        content = int8_tflite(state, ctx, io_dtype=state.quantize.io_dtype)
    elif state.precision is not None and state.precision.exclude:
        content = _float16_except(state.model, state.precision, ctx)
    elif state.precision is not None:
        content = _convert(state.model, ctx, "float16", _float16_settings(state.precision))
    else:
        content = _convert(state.model, ctx, "float32", lambda converter, tf: None)
    path.write_bytes(content)
    return path


def int8_tflite(state: ModelState, ctx: Context, io_dtype: str = "float32") -> bytes:
    """The full-int8 TFLite of a QAT or PTQ state (cached per model for the ONNX route)."""
    cache = ctx.extras.setdefault(INT8_CACHE_KEY, {})
    key = (id(state.model), state.quantize, io_dtype, state.float_layers)
    if key in cache and cache[key][0] is state.model:
        return cache[key][1]
    if len(cache) >= 2:   # a fallback search converts many candidates: keep only recent ones
        cache.clear()
    quantize = state.quantize
    samples = None
    if quantize.mode == "ptq":
        samples = _calibration_samples(ctx, quantize.calibration_samples, ctx.seed)
        samples = samples.astype(state.model.inputs[0].dtype.as_numpy_dtype)

    def configure(converter: Any, tf: Any) -> None:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        if io_dtype == "int8":
            converter.inference_input_type = tf.int8
            converter.inference_output_type = tf.int8
        if samples is not None:   # ptq; QAT models carry their learned ranges instead
            converter.representative_dataset = _representative_dataset(samples, ctx)
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]

    if quantize.fallback == "auto" or state.float_layers:
        content = _mixed_int8(state, ctx, io_dtype, configure)
    else:
        content = _convert(state.model, ctx, f"int8 {quantize.mode}", configure)
    _require_full_int8(content, quantize.mode, state.float_layers)
    cache[key] = (state.model, content)
    return content


def _mixed_int8(state: ModelState, ctx: Context, io_dtype: str, configure) -> bytes:
    """int8 with `state.float_layers` float: calibrate once, then quantize per layer set."""
    from compressor.export.tflite_mixed import mixed_int8_tflite

    if state.quantize.mode != "ptq":
        raise BackendUnavailableError("int8 TFLite with float layers needs quantize mode: ptq "
                                      "(a qat model carries its own ranges for every layer)")

    def calibrate_only(converter: Any, tf: Any) -> None:
        configure(converter, tf)
        converter.experimental_mlir_quantizer = True
        converter._experimental_calibrate_only = True   # QuantizationDebugger's route

    return mixed_int8_tflite(state, ctx, io_dtype,
                             lambda: _convert(state.model, ctx, "int8 calibration", calibrate_only))


def _float16_except(model: Any, precision: Any, ctx: Context) -> bytes:
    """float16 weights but for the `exclude`d layers: the converter has no per-layer option,
    so the float32 model's other conv / dense weights are stored as float16 afterwards (the
    form the converter gives them). Biases and other constants stay float32."""
    from compressor.export.tflite_mixed import (
        float16_weights,
        kernel_layer_names,
        layer_of,
    )

    _float16_settings(precision)   # the same refusals as a plain float16 conversion
    excluded = excluded_layers(kernel_layer_names(model), precision.exclude)
    content = _convert(model, ctx, "float32", lambda converter, tf: None)
    return float16_weights(content, lambda weight: layer_of(weight, excluded) is None)


def excluded_layers(layers: list[str], patterns: tuple[str, ...]) -> list[str]:
    """The layers `exclude` patterns (fnmatch, e.g. "dense*") name; a pattern naming none is
    almost always a typo, so it is refused."""
    import fnmatch

    unmatched = [p for p in patterns if not any(fnmatch.fnmatch(name, p) for name in layers)]
    if unmatched:
        raise RecipeError(f"precision exclude pattern(s) {', '.join(map(repr, unmatched))} match "
                          f"no conv / dense layer; the layers are: {', '.join(layers)}")
    return [name for name in layers if any(fnmatch.fnmatch(name, p) for p in patterns)]


def _float16_settings(precision: Any):
    if not precision.keep_io_types:
        raise BackendUnavailableError("TFLite float16 artifacts always keep float32 inputs and "
                                      "outputs; set keep_io_types: true or export onnx only")

    def configure(converter: Any, tf: Any) -> None:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]

    return configure


def _convert(model: Any, ctx: Context, kind: str, configure) -> bytes:
    tf = import_tensorflow()
    log = Path(ctx.workdir) / "logs" / "tflite-convert.log"
    from tensorflow.lite.python.convert_phase import ConverterError

    try:
        with captured_native_output(log, f"TFLite {kind}"):
            converter = tf.lite.TFLiteConverter.from_keras_model(model)
            configure(converter, tf)
            return converter.convert()
    except (ConverterError, ValueError, RuntimeError, TypeError) as exc:
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:240]
        raise BackendUnavailableError(
            f"TFLite {kind} conversion failed: {first_line}\n{log_tail(log)}\n(full log: {log}); "
            "a layer the converter does not support is the usual cause: replace it, or export "
            "onnx only") from None


def _calibration_samples(ctx: Context, count: int, seed: int) -> np.ndarray:
    if ctx.data.train is None or len(ctx.data.train[0]) == 0:
        raise DataError(f"int8 ptq calibrates on training inputs, but {ctx.data.name} has no "
                        "train split; pass data with x_train")
    x = np.asarray(ctx.data.train[0])
    # A seeded random subset: training splits are often ordered by class.
    chosen = np.random.default_rng(seed).permutation(len(x))[:count]
    return x[np.sort(chosen)]


def _representative_dataset(samples: np.ndarray, ctx: Context):
    def batches():
        with ctx.progress.task("calibrating int8", len(samples)) as advance:
            for index in range(len(samples)):
                yield [samples[index:index + 1]]
                advance(1)

    return batches


def _require_full_int8(content: bytes, mode: str, float_layers: tuple[str, ...] = ()) -> None:
    from compressor.export.tflite_mixed import layer_of

    float_ops = [f"{op} ({name})" for op, name in _kernel_ops_not_int8(content)
                 if layer_of(name, float_layers) is None]   # float layers are float on purpose
    if float_ops:
        remedy = ("try quantize mode: ptq, or a float16 precision step" if mode == "qat"
                  else "use a float16 precision step for this model instead")
        raise BackendUnavailableError(
            f"the int8 TFLite still computes {len(float_ops)} conv/dense op(s) in float: "
            f"{', '.join(float_ops[:5])}; these layers could not be quantized: {remedy}")


def _kernel_ops_not_int8(content: bytes) -> list[tuple[str, str]]:
    """(op, weight tensor name) of every conv / dense op whose weights or input are not int8."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    interpreter = Interpreter(model_content=content, experimental_op_resolver_type=(
        OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES))
    tensors = {t["index"]: t for t in interpreter.get_tensor_details()}
    not_int8 = []
    for op in interpreter._get_ops_details():  # the only op listing LiteRT offers in Python
        weight_input = KERNEL_OPS.get(op["op_name"])
        if weight_input is None:
            continue
        weight = tensors[op["inputs"][weight_input]]
        activation = tensors[op["inputs"][0 if op["op_name"] != "TRANSPOSE_CONV" else 2]]
        if weight["dtype"] != np.int8 or activation["dtype"] != np.int8:
            not_int8.append((op["op_name"], weight["name"]))
    return not_int8

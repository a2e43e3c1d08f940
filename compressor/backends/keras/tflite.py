"""tf_keras model -> .tflite: float32, float16 weights, full int8 (QAT or calibrated PTQ), or
int8 weights (dynamic, weight_only): one function per scheme (keras/handlers.py registers them).

Full int8 means int8 weights AND int8 activations in every conv / dense op; a converter
result that silently keeps float compute is refused (export/int8.py) rather than shipped.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from compressor.backends.keras.env import import_tensorflow
from compressor.backends.keras.input_fold import input_folded
from compressor.backends.keras.io import calibration_inputs, original_names
from compressor.backends.keras.recurrent import unrolled_for_tflite
from compressor.errors import BackendUnavailableError, RecipeError, converter_failure
from compressor.export.tflite import int8_weights, renamed_signature
from compressor.export.tflite_tables import int8_tables
from compressor.core.quiet import captured_native_output
from compressor.core.tensors import rows

if TYPE_CHECKING:
    from compressor.core.context import Context, ModelState
    from compressor.schemes import Float16, Int8Scheme

ENTRIES_PER_MODEL = 4   # a fallback search converts many candidates: keep only recent ones


class ConversionCache:
    """Converted TFLite bytes per model object, held weakly so they go with the model.

    The quantize fallback re-quantizes one calibrated model once per candidate: it reuses a
    conversion instead of repeating it.
    """

    def __init__(self) -> None:
        self._by_model: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def get(self, model: Any, key: tuple, make: Callable[[], bytes]) -> bytes:
        entries = self._by_model.setdefault(model, {})
        if key not in entries:
            if len(entries) >= ENTRIES_PER_MODEL:
                entries.clear()
            entries[key] = make()
        return entries[key]


def write_tflite(state: ModelState, content: bytes, path: Path, ctx: Context) -> Path:
    """`content` at `path`, its signature keeping the original model's I/O names."""
    path.write_bytes(renamed_signature(content, original_names(state.model, ctx)))
    return path


def float32_tflite(model: Any, ctx: Context) -> bytes:
    return _convert(model, ctx, "float32", lambda converter, tf: None)


def float16_tflite(model: Any, scheme: Float16, ctx: Context) -> bytes:
    """float16 conv / dense weights and embedding tables (but the `exclude`d layers'), float32
    I/O and every other constant float32. The converter's own float16 option rounds every
    constant, in-model preprocessing too: keras.applications' Rescaling / Normalization
    constants in float16 shift the narrow band images in [0, 1] become (EfficientNetV2B0: 0.951
    vs 0.963 float), so the float32 file's weights are stored as float16 here instead."""
    from compressor.backends.keras.mixed import kernel_layer_names, layer_of
    from compressor.export.tflite import float16_weights

    if not scheme.keep_io_types:
        raise BackendUnavailableError("TFLite float16 artifacts always keep float32 inputs and "
                                      "outputs; set keep_io_types: true or export onnx only")
    kernels = kernel_layer_names(model)
    excluded = excluded_layers(kernels, scheme.exclude) if scheme.exclude else []
    content = float32_tflite(model, ctx)
    return float16_weights(content, lambda weight: layer_of(weight, kernels) not in excluded)


def int8_weights_tflite(model: Any, scheme: Int8Scheme, ctx: Context) -> bytes:
    """int8 weights on the float32 TFLite by ai-edge-quantizer, in the scheme's mode
    (dynamic, weight_only: export/tflite.py POST_TRAINING_RECIPES); the embedding tables it
    leaves float32 are stored int8 per row (export/tflite_tables.py)."""
    return int8_tables(int8_weights(float32_tflite(model, ctx), scheme.method))


def ptq_tflite(state: ModelState, scheme: Int8Scheme, ctx: Context,
               cache: ConversionCache) -> bytes:
    """Full int8 calibrated on `calibration_samples` training inputs (cached per model);
    `state.float_layers` stay float. In-model input preprocessing the samples leave a narrow
    band is folded into the stem conv first (input_fold.py)."""
    def make() -> bytes:
        samples = calibration_inputs(state.model, ctx, scheme.calibration_samples)
        configure = _int8_settings(scheme, samples, ctx)
        folded = replace(state, model=input_folded(state.model, lambda: samples))
        if scheme.fallback == "auto" or state.float_layers:
            return _mixed_int8(folded, scheme, ctx, cache, configure)
        return _convert(folded.model, ctx, f"int8 {scheme.name}", configure)

    return cache.get(state.model, ("int8", scheme, state.float_layers), make)


def qat_tflite(state: ModelState, scheme: Int8Scheme, ctx: Context,
               cache: ConversionCache) -> bytes:
    """Full int8 with the ranges the QAT model learned (cached per model)."""
    if scheme.fallback == "auto" or state.float_layers:
        raise BackendUnavailableError("int8 TFLite with float layers needs quantize mode: ptq "
                                      "(a qat model carries its own ranges for every layer)")
    # tfmot leaves embedding tables float: they are stored int8 per row after conversion.
    return cache.get(state.model, ("int8", scheme, state.float_layers), lambda: int8_tables(
        _convert(state.model, ctx, f"int8 {scheme.name}", _int8_settings(scheme, None, ctx))))


def _int8_settings(scheme: Int8Scheme, samples: dict[str, np.ndarray] | None, ctx: Context):
    def configure(converter: Any, tf: Any) -> None:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        if scheme.io_dtype == "int8":
            converter.inference_input_type = tf.int8
            converter.inference_output_type = tf.int8
        if samples is not None:   # ptq; QAT models carry their learned ranges instead
            converter.representative_dataset = _representative_dataset(samples, ctx)
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]

    return configure


def _mixed_int8(state: ModelState, scheme: Int8Scheme, ctx: Context, cache: ConversionCache,
                configure) -> bytes:
    """int8 with `state.float_layers` float: calibrate once, then quantize per layer set."""
    from compressor.backends.keras.mixed import mixed_int8_tflite

    def calibrate_only(converter: Any, tf: Any) -> None:
        configure(converter, tf)
        converter.experimental_mlir_quantizer = True
        converter._experimental_calibrate_only = True   # QuantizationDebugger's route

    calibrated = cache.get(state.model, ("calibrated", scheme.calibration_samples, ctx.seed),
                           lambda: _convert(state.model, ctx, "int8 calibration", calibrate_only))
    return mixed_int8_tflite(state, scheme, ctx, calibrated)


def excluded_layers(layers: list[str], patterns: tuple[str, ...]) -> list[str]:
    """The layers `exclude` patterns (fnmatch, e.g. "dense*") name; a pattern naming none is
    almost always a typo, so it is refused."""
    import fnmatch

    unmatched = [p for p in patterns if not any(fnmatch.fnmatch(name, p) for name in layers)]
    if unmatched:
        raise RecipeError(f"precision exclude pattern(s) {', '.join(map(repr, unmatched))} match "
                          f"no conv / dense layer; the layers are: {', '.join(layers)}")
    return [name for name in layers if any(fnmatch.fnmatch(name, p) for p in patterns)]


def _convert(model: Any, ctx: Context, kind: str, configure) -> bytes:
    """TFLite bytes of `model` (recurrent layers unrolled: recurrent.py says why)."""
    unrolled = unrolled_for_tflite(model)
    return run_converter(lambda tf: tf.lite.TFLiteConverter.from_keras_model(unrolled), ctx,
                         kind, configure)


def run_converter(make: Callable[[Any], Any], ctx: Context, kind: str, configure) -> bytes:
    """`make(tf)`'s TFLiteConverter, set up by `configure(converter, tf)`, converted with its
    native output in a log; a failure is one line naming the log."""
    tf = import_tensorflow()
    log = Path(ctx.workdir) / "logs" / "tflite-convert.log"
    from tensorflow.lite.python.convert_phase import ConverterError

    try:
        with captured_native_output(log, f"TFLite {kind}"):
            converter = make(tf)
            configure(converter, tf)
            return converter.convert()
    except (ConverterError, ValueError, RuntimeError, TypeError) as exc:
        raise BackendUnavailableError(converter_failure(
            f"TFLite {kind} conversion", exc, "replace the unsupported layer or export onnx "
            "only", log)) from None


def _representative_dataset(samples: dict[str, np.ndarray], ctx: Context):
    """One sample per step: a list for one input, a dict by signature name for several."""
    def batches():
        count = rows(samples)
        with ctx.progress.task("calibrating int8", count) as advance:
            for index in range(count):
                one = {name: array[index:index + 1] for name, array in samples.items()}
                yield list(one.values()) if len(one) == 1 else one
                advance(1)

    return batches

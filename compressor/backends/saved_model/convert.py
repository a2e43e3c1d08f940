"""SavedModel -> artifacts, by the converters that read the folder itself.

- TFLite: tf.lite.TFLiteConverter.from_saved_model on the serving signature: float32,
  float16 weights, or full int8 (calibrated on training samples, float32 I/O).
- ONNX: tf2onnx on the SavedModel (what `python -m tf2onnx.convert --saved-model` does)
  gives the float32 graph, then the ONNX backend's route: as it is, float16, or int8 with
  onnxruntime's quantization tools (static QDQ calibrated on the same samples).

One function per scheme; saved_model/handlers.py registers them.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from compressor.backends.saved_model.model import SIGNATURE, SavedModel, input_feeds
from compressor.backends.training_data import calibration_samples
from compressor.errors import RecipeError

if TYPE_CHECKING:
    from compressor.backends.onnx.model import OnnxModel
    from compressor.core.context import Context
    from compressor.schemes import Float16, Int8Scheme


def tflite_float32(model: SavedModel, path: Path, ctx: Context) -> Path:
    return _write(model, path, ctx, "float32", lambda converter, tf: None)


def tflite_float16(model: SavedModel, scheme: Float16, path: Path, ctx: Context) -> Path:
    """float16 weights, float32 I/O: the converter has no per-layer or I/O choice here."""
    if scheme.exclude or not scheme.keep_io_types:
        raise RecipeError("precision exclude / keep_io_types: false are not available for "
                          "SavedModel TFLite files; remove them, or use --format onnx")

    def configure(converter: Any, tf: Any) -> None:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]

    return _write(model, path, ctx, "float16", configure)


def tflite_int8(model: SavedModel, scheme: Int8Scheme, path: Path, ctx: Context) -> Path:
    """Full int8 compute calibrated on `calibration_samples` training inputs, float32 I/O."""
    samples = input_feeds(model, calibration_samples(ctx, scheme.calibration_samples))

    def configure(converter: Any, tf: Any) -> None:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = _representative(samples)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]

    return _write(model, path, ctx, "int8", configure)


def _write(model: SavedModel, path: Path, ctx: Context, kind: str, configure) -> Path:
    path.write_bytes(_convert(model, ctx, kind, configure))
    return path


def _representative(samples: dict[str, Any]):
    rows = len(next(iter(samples.values())))

    def batches():
        for index in range(rows):
            yield {name: array[index:index + 1] for name, array in samples.items()}

    return batches


def _convert(model: SavedModel, ctx: Context, kind: str, configure) -> bytes:
    from compressor.backends.keras.tflite import run_converter

    return run_converter(lambda tf: tf.lite.TFLiteConverter.from_saved_model(
        str(model.path), signature_keys=[SIGNATURE]), ctx, kind, configure)


def float32_onnx(model: SavedModel, ctx: Context) -> OnnxModel:
    """The SavedModel's serving signature as a float32 ONNX graph (converted once per run)."""
    from compressor.backends.onnx.model import OnnxModel

    workdir = Path(ctx.workdir)
    if workdir not in model.onnx:
        from compressor.backends.keras.onnx import OPSET, _tf2onnx

        log = workdir / "logs" / "onnx-convert.log"

        def convert(tf2onnx: Any) -> Any:
            from tf2onnx import tf_loader

            graph, inputs, outputs, tables, renames = tf_loader.from_saved_model(
                str(model.path), None, None, tag="serve", signatures=[SIGNATURE],
                return_initialized_tables=True, return_tensors_to_rename=True)
            return tf2onnx.convert._convert_common(
                graph, name=model.path.name, opset=OPSET, input_names=inputs,
                output_names=outputs, tensors_to_rename=renames, initialized_tables=tables)

        model.onnx = {workdir: OnnxModel(_tf2onnx(log, "float32", convert))}
    return model.onnx[workdir]

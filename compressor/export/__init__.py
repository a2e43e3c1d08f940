"""Exporters: compressed framework models -> deployable artifacts (.tflite, .onnx).

The format modules import TensorFlow / tf2onnx / onnx lazily, only when an export runs.
Keras routes: tflite.py (TFLiteConverter: fp32, fp16, full int8) and onnx.py (tf2onnx:
fp32 / fp16 from the Keras model, int8 from the int8 TFLite so weights stay int8).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from compressor.errors import BackendUnavailableError

if TYPE_CHECKING:
    from compressor.context import Context, ModelState

FORMATS = ("tflite", "onnx")


def export_keras(state: ModelState, fmt: str, path: Path, ctx: Context) -> Path:
    """Write the `fmt` artifact of a tf_keras model state at `path`; state.model is not changed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "tflite":
        from compressor.export.tflite import tflite_from_keras

        return tflite_from_keras(state, path, ctx)
    if fmt == "onnx":
        from compressor.export.onnx import onnx_from_keras

        return onnx_from_keras(state, path, ctx)
    raise BackendUnavailableError(f"cannot export to {fmt!r}; the formats are "
                                  f"{', '.join(FORMATS)}")

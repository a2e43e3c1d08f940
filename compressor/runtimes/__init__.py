"""Run and inspect exported artifacts in their real runtimes (LiteRT, onnxruntime).

Everything a report says about an artifact comes from here: read back from the file, or
measured by running it, never taken from the framework model.
"""
from __future__ import annotations

from pathlib import Path

from compressor.runtimes.base import ArtifactInfo, Runtime, WeightTensor, format_of

__all__ = ["ArtifactInfo", "Runtime", "WeightTensor", "format_of", "inspect_artifact",
           "open_runtime"]


def open_runtime(path: Path, threads: int | None = None) -> Runtime:
    if format_of(path) == "tflite":
        from compressor.runtimes.tflite import TFLiteRuntime

        return TFLiteRuntime(path, threads=threads)
    from compressor.runtimes.onnx import OnnxRuntime

    return OnnxRuntime(path, threads=threads)


def inspect_artifact(path: Path) -> ArtifactInfo:
    if format_of(path) == "tflite":
        from compressor.runtimes.tflite import inspect_tflite

        return inspect_tflite(Path(path))
    from compressor.runtimes.onnx import inspect_onnx

    return inspect_onnx(Path(path))

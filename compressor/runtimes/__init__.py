"""Run and inspect exported artifacts in their real runtimes (LiteRT, onnxruntime).

Everything a report says about an artifact comes from here: read back from the file, or
measured by running it, never taken from the framework model.
"""
from __future__ import annotations

from pathlib import Path

from compressor.runtimes.base import ArtifactInfo, Runtime, SampleShapes, WeightTensor, format_of

__all__ = ["ArtifactInfo", "Runtime", "WeightTensor", "format_of", "inspect_artifact",
           "open_runtime"]


def open_runtime(path: Path, threads: int | None = None,
                 optimization: str | None = None) -> Runtime:
    """`path` in its runtime; `optimization`: an ONNX file's onnxruntime graph optimization
    level (runtimes/onnx.py ORT_LEVELS; TFLite files have none)."""
    if format_of(path) == "tflite":
        from compressor.runtimes.tflite import TFLiteRuntime

        return TFLiteRuntime(path, threads=threads)
    from compressor.runtimes.onnx import OnnxRuntime

    return OnnxRuntime(path, threads=threads, optimization=optimization)


def inspect_artifact(path: Path, sample_shapes: SampleShapes | None = None) -> ArtifactInfo:
    """What the file holds; `sample_shapes` (input name -> one sample's shape, from the data)
    fixes free dims such as the sequence length, so both formats count MACs on the same shapes."""
    if Path(path).is_dir():   # an LLM's onnxruntime-genai folder (model-onnx/)
        from compressor.runtimes.genai_inspect import inspect_genai

        return inspect_genai(Path(path))
    if format_of(path) == "tflite":
        from compressor.runtimes.tflite import inspect_tflite
        from compressor.runtimes.tflite_file import with_int4_weights

        # LiteRT shows INT4 as int8
        return with_int4_weights(inspect_tflite(Path(path), sample_shapes))
    from compressor.runtimes.onnx import inspect_onnx

    return inspect_onnx(Path(path), sample_shapes)

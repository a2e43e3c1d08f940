"""Run and inspect exported artifacts in their real runtimes (LiteRT, onnxruntime).

Everything a report says about an artifact comes from here: read back from the file, or
measured by running it, never taken from the framework model. Which runtime opens a file and
which inspector reads it is the format's registry entry (compressor/formats).
"""
from __future__ import annotations

from pathlib import Path

from compressor.errors import ModelLoadError
from compressor.formats import artifact_suffixes, format_named, registered_formats, resolve
from compressor.runtimes.base import ArtifactInfo, Runtime, SampleShapes, WeightTensor, format_of

__all__ = ["ArtifactInfo", "Runtime", "WeightTensor", "format_of", "inspect_artifact",
           "open_runtime"]


def open_runtime(path: Path, threads: int | None = None,
                 optimization: str | None = None) -> Runtime:
    """`path` in its runtime; `optimization`: an ONNX file's onnxruntime graph optimization
    level (runtimes/onnx.py ORT_LEVELS; formats whose runtime has none ignore it)."""
    fmt = format_named(format_of(path))
    options = {"optimization": optimization} if "optimization" in fmt.options else {}
    return resolve(fmt.open)(path, threads=threads, **options)


def inspect_artifact(path: Path, sample_shapes: SampleShapes | None = None) -> ArtifactInfo:
    """What the file holds; `sample_shapes` (input name -> one sample's shape, from the data)
    fixes free dims such as the sequence length, so every format counts MACs on the same shapes."""
    if Path(path).is_dir():   # an LLM's folder artifact (an onnxruntime-genai model-onnx/)
        folder = next((f for f in registered_formats() if f.is_folder_artifact(Path(path))), None)
        if folder is None:
            hints = [f"{f.folder_hint} ({f.folder})" for f in registered_formats() if f.folder]
            raise ModelLoadError(f"{path}: not an artifact compressor can run; expected "
                                 f"{' or '.join([*artifact_suffixes(), *hints])}")
        return resolve(folder.inspect_folder)(Path(path))
    return resolve(format_named(format_of(path)).inspect)(Path(path), sample_shapes)


def inspect_tflite_file(path: Path, sample_shapes: SampleShapes | None = None) -> ArtifactInfo:
    """A .tflite file's facts, its INT4 tensors named so (LiteRT shows INT4 as int8)."""
    from compressor.runtimes.tflite import inspect_tflite
    from compressor.runtimes.tflite_file import with_int4_weights

    return with_int4_weights(inspect_tflite(Path(path), sample_shapes))

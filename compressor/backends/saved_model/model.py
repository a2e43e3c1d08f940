"""A TensorFlow SavedModel without Keras metadata (`tf.saved_model.save`, Keras 3
`model.export`) as the model a run compresses: its serving signature is the model.

The folder is only read (tf.saved_model.load, and the converters read it again at export).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from compressor.backends.base import ModelInfo
from compressor.backends.keras.env import import_tensorflow
from compressor.errors import DataError, ModelLoadError, first_line
from compressor.core.tensors import Arrays, TensorSpec, matched

SIGNATURE = "serving_default"


@dataclass(eq=False)
class SavedModel:
    """The loaded SavedModel, its serving signature and that signature's named I/O."""

    path: Path
    loaded: Any
    signature: Any
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    onnx: dict[Path, Any] = field(default_factory=dict)   # workdir -> float32 OnnxModel


def load_saved_model(source: Any) -> SavedModel:
    if not isinstance(source, (str, Path)):
        raise ModelLoadError(f"cannot load a {type(source).__qualname__} as a SavedModel; pass "
                             "the SavedModel folder's path")
    path = Path(source)
    if not (path / "saved_model.pb").is_file():
        raise ModelLoadError(f"{path} is not a SavedModel folder (no saved_model.pb); pass the "
                             "folder tf.saved_model.save or model.export wrote")
    tf = import_tensorflow()
    try:
        loaded = tf.saved_model.load(str(path))
    except (OSError, ValueError, TypeError, KeyError, RuntimeError, tf.errors.OpError) as exc:
        raise ModelLoadError(f"{path}: TensorFlow cannot load this SavedModel "
                             f"({first_line(exc)}); save it again") from None
    signatures = getattr(loaded, "signatures", {})
    if SIGNATURE not in signatures:
        raise ModelLoadError(f"{path} has no {SIGNATURE!r} signature (it has "
                             f"{', '.join(signatures) or 'none'}); save it with "
                             "tf.saved_model.save(model, path, signatures=...) or model.export")
    signature = signatures[SIGNATURE]
    _, named_inputs = signature.structured_input_signature
    outputs = signature.structured_outputs
    if not isinstance(outputs, dict) or not named_inputs:
        raise ModelLoadError(f"{path}: the {SIGNATURE!r} signature must take named tensors and "
                             "return a dict of tensors; save it with tf.saved_model.save")
    return SavedModel(path, loaded, signature, _specs(named_inputs), _specs(outputs))


def _specs(named: dict[str, Any]) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(name, (None, *spec.shape.as_list()[1:]) if spec.shape.rank else (),
                            np.dtype(spec.dtype.as_numpy_dtype).name)
                 for name, spec in named.items())


def describe_saved_model(model: SavedModel) -> ModelInfo:
    variables = list(getattr(model.loaded, "variables", ()))
    values = [np.asarray(v.numpy()) for v in variables]
    return ModelInfo(params=sum(int(v.size) for v in values if v.dtype.kind == "f"),
                     inputs=model.inputs, outputs=model.outputs,
                     size_bytes=sum(int(v.nbytes) for v in values))


def input_feeds(model: SavedModel, x: Arrays) -> dict[str, np.ndarray]:
    """The data as the signature's named inputs, each cast to the signature's dtype."""
    names = [spec.name for spec in model.inputs]
    return {spec.name: np.asarray(array, dtype=spec.dtype)
            for spec, array in zip(model.inputs, matched(x, names))}


def predict_saved_model(model: SavedModel, x: Arrays, batch_size: int = 256) -> Arrays:
    tf = import_tensorflow()
    feeds = input_feeds(model, x)
    rows = len(next(iter(feeds.values())))
    chunks = []
    for start in range(0, rows, batch_size):
        batch = {name: tf.constant(a[start:start + batch_size]) for name, a in feeds.items()}
        try:
            result = model.signature(**batch)
        except (ValueError, TypeError, tf.errors.InvalidArgumentError) as exc:
            raise DataError(f"the SavedModel's {SIGNATURE!r} signature cannot run the data "
                            f"({first_line(exc)}); it expects "
                            f"{'; '.join(s.describe() for s in model.inputs)}") from None
        chunks.append({spec.name: np.asarray(result[spec.name]) for spec in model.outputs})
    outputs = {spec.name: np.concatenate([c[spec.name] for c in chunks]) for spec in model.outputs}
    return next(iter(outputs.values())) if len(outputs) == 1 else outputs

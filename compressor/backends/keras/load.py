"""Load Keras models from files or memory as private tf_keras copies.

Nothing here changes the caller's file or model: files are only read, and in-memory models
are cloned with their weights (tfmot wraps layer objects in place, so sharing them would
prune the caller's model too). Every failure is a one-line ModelLoadError.
"""
from __future__ import annotations

import contextlib
import json
import zipfile
from pathlib import Path
from typing import Any

from compressor.backends.keras.env import (
    import_tf_keras,
    import_tfmot,
    is_keras3_model,
    is_tf_keras_model,
)
from compressor.backends.keras.config_scan import refused, stored_code
from compressor.errors import ModelLoadError, first_line

# What tf_keras / h5py / zipfile raise for unreadable, truncated or unknown content.
LOAD_ERRORS = (OSError, ValueError, TypeError, KeyError, IndexError, ImportError, EOFError,
               AttributeError, zipfile.BadZipFile)
TFMOT_LAYER_MODULE = "tensorflow_model_optimization"
TFMOT_MARKERS = (b"QuantizeWrapper", b"QuantizeLayer", b"QuantizeAnnotate", b"PruneLowMagnitude")


def load_keras_model(source: Any, weights: str | None = None, trust_pickle: bool = False) -> Any:
    if isinstance(source, (str, Path)):
        model = _load_file(Path(source), trust_pickle)
    elif is_tf_keras_model(source):
        model = clone_keras_model(source)
    elif is_keras3_model(source):
        from compressor.backends.keras.rebuild import rebuild_in_tf_keras

        model = rebuild_in_tf_keras(source, source=f"in-memory {type(source).__name__}")
    else:
        raise ModelLoadError(f"cannot load a {type(source).__qualname__} as a Keras model; pass "
                             "a tf_keras model or a .keras / .h5 / SavedModel path")
    if weights is not None:
        _load_weights(model, Path(weights))
    return model


def clone_keras_model(model: Any) -> Any:
    """A copy with its own layers and equal weights (pruning / QAT wrappers included)."""
    tf_keras = import_tf_keras()
    if not (isinstance(model, tf_keras.Sequential) or getattr(model, "_is_graph_network", False)):
        raise ModelLoadError(f"{type(model).__name__} is a subclassed model, which tfmot cannot "
                             "prune or quantize; build it as a Functional or Sequential model")
    try:
        with _tfmot_scope(model):
            copy = tf_keras.models.clone_model(model)
    except ValueError as exc:
        raise ModelLoadError(f"cannot copy this {type(model).__name__} ({first_line(exc)}); "
                             "compressor works on Sequential and Functional tf_keras models, "
                             "so build it as one of those") from None
    copy.set_weights(model.get_weights())
    return copy


def has_tfmot_layers(model: Any) -> bool:
    """True for a model holding tfmot wrappers (QAT or pruning), e.g. after quantize_qat."""
    return any(type(layer).__module__.startswith(TFMOT_LAYER_MODULE) for layer in model.layers)


def _tfmot_scope(model: Any):
    """Wrapped layers (QAT, pruning) deserialize only inside tfmot's custom-object scope."""
    return _tfmot_custom_objects() if has_tfmot_layers(model) else contextlib.nullcontext()


def _tfmot_custom_objects():
    tfmot = import_tfmot()
    scope = contextlib.ExitStack()
    scope.enter_context(tfmot.quantization.keras.quantize_scope())
    scope.enter_context(tfmot.sparsity.keras.prune_scope())
    return scope


def _load_file(path: Path, trust_pickle: bool) -> Any:
    configs, keras_version = _stored_configs(path)
    code = None if trust_pickle else stored_code(path, configs)
    if code:
        raise refused(path, code)   # checked here: legacy .h5 loading would run it unasked
    config = b"".join(c.encode() if isinstance(c, str) else c for c in configs)
    try:
        return _tf_keras_load(path, trust_pickle,
                              tfmot_layers=any(marker in config for marker in TFMOT_MARKERS))
    except ModelLoadError:
        if not keras_version.startswith("3."):
            raise
    # A file only Keras 3 can read: load it with Keras 3, then rebuild it in tf_keras.
    from compressor.backends.keras.rebuild import rebuild_in_tf_keras

    return rebuild_in_tf_keras(_keras3_load(path, trust_pickle), source=str(path))


def _stored_configs(path: Path) -> tuple[list[bytes], str]:
    """(the model's JSON configs as stored, Keras version that wrote it), or why the file is
    unusable. A SavedModel stores one JSON config per saved object."""
    if not path.exists():
        raise ModelLoadError(f"model {path} does not exist; check the path")
    if path.is_dir():
        return _saved_model_configs(path), ""
    if path.suffix == ".keras":
        config, version = _keras_archive_config(path)
        return [config], version
    if path.suffix in (".h5", ".hdf5"):
        config, version = _h5_config(path)
        return [config], version
    raise ModelLoadError(f"{path}: unsupported Keras model format {path.suffix or '(none)'}; "
                         "use .keras, .h5 or a SavedModel folder")


def _saved_model_configs(path: Path) -> list[bytes]:
    if not (path / "saved_model.pb").is_file():
        raise ModelLoadError(f"{path} is a folder but not a SavedModel (no saved_model.pb); "
                             "pass the model file or the SavedModel folder itself")
    metadata = path / "keras_metadata.pb"
    if not metadata.is_file():
        raise ModelLoadError(f"{path} is a TensorFlow SavedModel without Keras metadata; "
                             "compressor needs the Keras model: save it with model.save('model.keras')")
    import_tf_keras()   # the proto module below lives in tf_keras' package
    from google.protobuf.message import DecodeError
    from tf_keras.protobuf import saved_metadata_pb2

    saved = saved_metadata_pb2.SavedMetadata()
    try:
        saved.ParseFromString(metadata.read_bytes())
    except DecodeError:
        raise ModelLoadError(f"{metadata} is corrupt; save the model again with "
                             "model.save('model.keras')") from None
    return [node.metadata.encode() for node in saved.nodes if node.metadata]


def _keras_archive_config(path: Path) -> tuple[bytes, str]:
    try:
        with zipfile.ZipFile(path) as archive:
            config = archive.read("config.json")
            metadata = json.loads(archive.read("metadata.json"))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        raise ModelLoadError(f"{path} is not a valid .keras archive (truncated or corrupt?); "
                             "save the model again with model.save('model.keras')") from None
    return config, str(metadata.get("keras_version", ""))


def _h5_config(path: Path) -> tuple[bytes, str]:
    import h5py

    try:
        with h5py.File(path, "r") as h5:
            config = h5.attrs.get("model_config", "")
            version = h5.attrs.get("keras_version", "")
    except OSError:
        raise ModelLoadError(f"{path} is not a readable HDF5 file (truncated or corrupt?); save "
                             "the model again with model.save('model.keras')") from None
    config = config.encode() if isinstance(config, str) else bytes(config)
    if not config:
        raise ModelLoadError(f"{path} holds weights only, no model architecture; pass the model "
                             "file and give this file with --weights")
    return config, version.decode() if isinstance(version, bytes) else str(version)


def _tf_keras_load(path: Path, trust_pickle: bool, tfmot_layers: bool) -> Any:
    tf_keras = import_tf_keras()
    kwargs = {} if path.suffix in (".h5", ".hdf5") else {"safe_mode": not trust_pickle}
    # A model saved mid-compression (QAT / pruning wrappers) needs tfmot's layer classes.
    scope = _tfmot_custom_objects() if tfmot_layers else contextlib.nullcontext()
    try:
        with scope:
            return tf_keras.models.load_model(str(path), compile=False, **kwargs)
    except LOAD_ERRORS as exc:
        raise _load_failed(path, exc, "tf_keras") from None


def _keras3_load(path: Path, trust_pickle: bool) -> Any:
    try:
        import keras
    except ImportError:
        raise ModelLoadError(f"{path} was saved by Keras 3, which is not installed here; install "
                             "keras>=3 or save the model from tf_keras") from None
    try:
        return keras.saving.load_model(str(path), compile=False, safe_mode=not trust_pickle)
    except LOAD_ERRORS as exc:
        raise _load_failed(path, exc, "Keras 3") from None


def _load_failed(path: Path, exc: BaseException, loader: str) -> ModelLoadError:
    message = first_line(exc)
    if "safe_mode" in str(exc) or "lambda" in message.lower():
        return _lambda_refused(path)
    if "Unknown layer" in message or "custom_objects" in str(exc):
        return ModelLoadError(f"{path} uses a custom layer that {loader} cannot find ({message}); "
                              "pass the in-memory model to the Python API instead")
    return ModelLoadError(f"{path}: {loader} cannot read it ({message}); check that the file is "
                          "complete and was saved with model.save()")


def _lambda_refused(path: Path) -> ModelLoadError:
    return refused(path, "a Lambda layer")


def _load_weights(model: Any, path: Path) -> None:
    if not path.is_file():
        raise ModelLoadError(f"weights file {path} does not exist; check the --weights path")
    try:
        model.load_weights(str(path))
    except LOAD_ERRORS as exc:
        raise ModelLoadError(f"{path}: cannot load these weights into the model "
                             f"({first_line(exc)}); they must come from the same architecture"
                             ) from None

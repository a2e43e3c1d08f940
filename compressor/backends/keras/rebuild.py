"""Rebuild a Keras 3 model as a tf_keras (Keras 2) model, which tfmot can work on.

The Keras 3 config is translated to the Keras 2 format (layer by layer, node by node),
the weights are copied layer by layer, and the rebuilt model must reproduce the original's
outputs on a random batch: a rebuild that changes what the model computes is refused.
"""
from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from compressor.backends.keras.env import import_tf_keras
from compressor.errors import ModelLoadError, first_line

MODEL_CLASSES = ("Functional", "Model", "Sequential")
# Keyword arguments every tf_keras Layer accepts besides those in its own __init__.
BASE_LAYER_KEYS = {"name", "trainable", "dtype", "dynamic", "input_dim", "input_shape",
                   "batch_input_shape", "batch_size", "weights", "activity_regularizer",
                   "autocast"}
OUTPUT_ATOL = 1e-4


def rebuild_in_tf_keras(keras3_model: Any, source: str) -> Any:
    """A tf_keras copy of a Keras 3 Sequential / Functional model, or a ModelLoadError."""
    tf_keras = import_tf_keras()
    class_name = type(keras3_model).__name__
    if class_name not in MODEL_CLASSES:
        raise ModelLoadError(f"{source}: a subclassed Keras 3 model ({class_name}) cannot be "
                             "rebuilt in tf_keras; rebuild it as a Functional or Sequential model")
    config = _translate_model_config(keras3_model.get_config(), tf_keras)
    try:
        if class_name == "Sequential":
            model = tf_keras.Sequential.from_config(config)
        else:
            model = tf_keras.Model.from_config(config)
    except (TypeError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"{source}: cannot rebuild this Keras 3 model in tf_keras "
                             f"({first_line(exc)}); save it from tf_keras instead") from None
    _copy_weights(keras3_model, model, source)
    _check_same_outputs(keras3_model, model, source)
    return model


def _translate_model_config(config: dict, tf_keras: Any) -> dict:
    translated = {key: value for key, value in config.items()
                  if key in ("name", "trainable", "input_layers", "output_layers")}
    translated["layers"] = [_translate_layer(entry, tf_keras) for entry in config["layers"]]
    for key in ("input_layers", "output_layers"):
        if key in translated:
            translated[key] = _as_history_list(translated[key])
    return translated


def _translate_layer(entry: dict, tf_keras: Any) -> dict:
    class_name = entry["class_name"]
    name = entry.get("name") or entry["config"].get("name")
    if class_name in MODEL_CLASSES:
        config = _translate_model_config(entry["config"], tf_keras)
    else:
        layer_cls = getattr(tf_keras.layers, class_name, None)
        module = str(entry.get("module") or "")
        if layer_cls is None or not module.startswith(("keras.layers", "keras.src.layers")):
            raise ModelLoadError(
                f"layer {name!r} ({module or 'custom'}.{class_name}) has no tf_keras (Keras 2) "
                "equivalent, so tfmot cannot prune or quantize this Keras 3 model; replace the "
                "layer with a built-in Keras 2 layer or build the model with tf_keras")
        config = _fitted_layer_config(layer_cls, name, _plain(entry["config"]))
    translated = {"class_name": class_name, "config": config, "name": name}
    if "inbound_nodes" in entry:
        translated["inbound_nodes"] = [_translate_node(node, name)
                                       for node in entry["inbound_nodes"]]
    return translated


def _plain(value: Any) -> Any:
    """Drop Keras 3 serialization wrappers: module / registered_name, DTypePolicy objects."""
    if isinstance(value, dict):
        if value.get("class_name") in ("DTypePolicy", "FloatDTypePolicy"):
            return value["config"]["name"]
        if "class_name" in value and "config" in value:
            return {"class_name": value["class_name"], "config": _plain(value["config"])}
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def _fitted_layer_config(layer_cls: type, name: str, config: dict) -> dict:
    """The config with Keras 3-only keys removed; a key that changes behaviour is an error."""
    if "batch_shape" in config:
        config["batch_input_shape"] = config.pop("batch_shape")
    accepted = set(BASE_LAYER_KEYS)
    for cls in layer_cls.__mro__:
        if "__init__" in vars(cls):
            accepted |= set(inspect.signature(cls.__init__).parameters)
    fitted = {}
    for key, value in config.items():
        if key in accepted:
            fitted[key] = _fitted_initializer(value) if key.endswith("_initializer") else value
        elif value not in (None, False, {}, [], ""):
            raise ModelLoadError(
                f"layer {name!r} ({layer_cls.__name__}) uses the Keras 3-only setting "
                f"{key}={value!r}, which tf_keras cannot reproduce; remove it or build the "
                "model with tf_keras")
    return fitted


def _fitted_initializer(value: Any) -> Any:
    # Initializers only make the first weights, which the copied weights replace; Keras 3
    # adds arguments (input_axes, ...) that tf_keras' initializers do not take.
    if isinstance(value, dict) and "class_name" in value:
        return {"class_name": value["class_name"], "config": {}}
    return value


def _translate_node(node: dict, layer_name: str) -> list:
    """Keras 3 {"args", "kwargs"} -> Keras 2 [[layer, node_index, tensor_index, kwargs], ...]."""
    kwargs = {key: value for key, value in node.get("kwargs", {}).items() if value is not None}
    if _keras_tensors(kwargs):
        raise ModelLoadError(f"layer {layer_name!r} takes tensors as keyword arguments, which "
                             "tf_keras cannot rebuild; build the model with tf_keras")
    histories = [tensor["config"]["keras_history"] for tensor in _keras_tensors(node["args"])]
    if not histories:
        raise ModelLoadError(f"layer {layer_name!r} is called on constants only, which tf_keras "
                             "cannot rebuild; build the model with tf_keras")
    return [[*history, kwargs] for history in histories]


def _keras_tensors(value: Any) -> list[dict]:
    if isinstance(value, dict):
        if value.get("class_name") == "__keras_tensor__":
            return [value]
        return [t for item in value.values() for t in _keras_tensors(item)]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _keras_tensors(item)]
    return []


def _as_history_list(value: list) -> list:
    # Keras 3 writes a single input as ["name", 0, 0]; Keras 2 wants [["name", 0, 0]].
    if len(value) == 3 and isinstance(value[0], str):
        return [value]
    return value


def _copy_weights(keras3_model: Any, model: Any, source: str) -> None:
    rebuilt = {layer.name: layer for layer in _all_layers(model)}
    for layer in _all_layers(keras3_model):
        weights = layer.get_weights()
        if not weights or layer.name not in rebuilt:
            continue
        target = rebuilt[layer.name]
        shapes = [w.shape for w in weights]
        if shapes != [tuple(w.shape) for w in target.get_weights()]:
            raise ModelLoadError(f"{source}: layer {layer.name!r} stores its weights differently "
                                 "in Keras 3 and tf_keras; build the model with tf_keras")
        target.set_weights(weights)


def _all_layers(model: Any) -> list:
    layers = []
    for layer in model.layers:
        layers.extend(_all_layers(layer) if hasattr(layer, "layers") else [layer])
    return layers


def _check_same_outputs(keras3_model: Any, model: Any, source: str) -> None:
    rng = np.random.default_rng(0)
    batch = []
    for tensor in model.inputs:
        shape = [2] + [dim or 8 for dim in tensor.shape[1:]]
        if tensor.dtype.is_floating:
            batch.append(rng.standard_normal(shape).astype(tensor.dtype.as_numpy_dtype))
        else:
            batch.append(rng.integers(0, 2, shape).astype(tensor.dtype.as_numpy_dtype))
    batch = batch[0] if len(batch) == 1 else batch
    expected = _as_arrays(keras3_model(batch, training=False))
    got = _as_arrays(model(batch, training=False))
    diff = max(float(np.max(np.abs(e - g))) for e, g in zip(expected, got))
    if not diff <= OUTPUT_ATOL * max(1.0, max(float(np.max(np.abs(e))) for e in expected)):
        raise ModelLoadError(f"{source}: the tf_keras rebuild of this Keras 3 model computes "
                             f"different outputs (max difference {diff:.3g}); build the model "
                             "with tf_keras instead")


def _as_arrays(outputs: Any) -> list[np.ndarray]:
    if isinstance(outputs, dict):
        outputs = list(outputs.values())
    if not isinstance(outputs, (list, tuple)):
        outputs = [outputs]
    return [np.asarray(output) for output in outputs]

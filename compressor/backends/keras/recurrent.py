"""Recurrent layers (LSTM, GRU, SimpleRNN, Bidirectional) as TFLite can run them statelessly.

The TFLite converter cannot lower a Keras RNN loop with a dynamic batch (`tf.TensorListReserve
... element_shape to be static`), and with a fixed batch it fuses the loop into
UNIDIRECTIONAL_SEQUENCE_LSTM, whose state tensors LiteRT keeps from one call to the next:
every row after the first starts from the previous row's state. An unrolled copy (the loop
written out over a fixed sequence length) converts to plain built-in ops, keeps the dynamic
batch and starts every call from zero state. ONNX does not need this: tf2onnx emits
ONNX LSTM / GRU / RNN ops, which take their initial state as an input.
"""
from __future__ import annotations

import weakref
from typing import Any

from compressor.backends.keras.env import import_tf_keras
from compressor.errors import BackendUnavailableError, first_line

_UNROLLED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def unrolled_for_tflite(model: Any) -> Any:
    """`model` itself when it has no recurrent layer left to unroll, else a copy (cached per
    model) whose recurrent layers have unroll=True and stateful=False, with the same weights."""
    layers = recurrent_layers(model)
    if not any(_needs_copy(layer) for layer in layers):
        return model
    if model not in _UNROLLED:
        _require_fixed_length(layers)
        _UNROLLED[model] = _unrolled_copy(model)
    return _UNROLLED[model]


def recurrent_layers(model: Any) -> list:
    """The RNN layers of `model`, nested models and Bidirectional wrappers included."""
    keras = import_tf_keras()
    found = []
    for layer in getattr(model, "layers", ()):
        if isinstance(layer, keras.layers.RNN):
            found.append(layer)
        elif isinstance(layer, keras.layers.Bidirectional):
            found.append(layer)
        elif hasattr(layer, "layers"):
            found.extend(recurrent_layers(layer))
    return found


def _needs_copy(layer: Any) -> bool:
    config = layer.get_config()
    config = config.get("layer", {}).get("config", config)   # Bidirectional: the wrapped RNN
    return not config.get("unroll", True) or bool(config.get("stateful"))


def _require_fixed_length(layers: list) -> None:
    for layer in layers:
        shape = layer.get_input_shape_at(0)
        shape = shape[0] if isinstance(shape, list) else shape   # [sequence, *initial states]
        if len(shape) > 1 and shape[1] is None:
            raise BackendUnavailableError(
                f"recurrent layer {layer.name!r} runs over sequences of any length (time "
                "dimension None): TFLite needs the loop unrolled over a fixed length; give the "
                "model a fixed-length input, e.g. keras.Input((16,)), or export onnx only")


def _unrolled_copy(model: Any) -> Any:
    keras = import_tf_keras()

    def clone(layer: Any) -> Any:
        return layer.__class__.from_config(_unrolled_config(layer.get_config()))

    try:
        copy = keras.models.clone_model(model, clone_function=clone)
        copy.set_weights(model.get_weights())
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise BackendUnavailableError(
            f"cannot make an unrolled copy of this model for TFLite ({first_line(exc, 120)}); "
            "build its recurrent layers with unroll=True, or export onnx only") from None
    return copy


def _unrolled_config(value: Any) -> Any:
    """A layer config with every (nested) RNN config set to unroll=True, stateful=False."""
    if isinstance(value, list):
        return [_unrolled_config(item) for item in value]
    if not isinstance(value, dict):
        return value
    config = {key: _unrolled_config(item) for key, item in value.items()}
    if "unroll" in config:
        config["unroll"], config["stateful"] = True, False
    return config

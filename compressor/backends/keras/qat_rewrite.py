"""A copy of a Keras model that computes the same and that tfmot's QAT can wrap whole.

Two constructs of keras.applications nets, rewritten in the model config:
- scalar arithmetic on a tensor (`x + 3.0`, `x * (1.0 / 6.0)`: MobileNetV3's hard-swish and
  hard-sigmoid) is stored as a TFOpLambda, which tfmot's layout transform rebuilds with its
  tensor wrapped in a list (AttributeError in quantize_apply). `x + c`, `x - c`, `x * c`,
  `x / c` is `Rescaling(scale, offset)`: the same values, the same TFLite ops;
- a conv / dense layer with an activation TFLite cannot fuse into it (`swish`, `sigmoid`:
  EfficientNetV2's squeeze-excite convs): tfmot puts the int8 range after the activation
  only, so the TFLite conv op had no output range and stayed float. The activation becomes
  its own Activation layer right after the conv, whose output tfmot quantizes.
"""
from __future__ import annotations

from typing import Any

from compressor.backends.keras.env import import_tf_keras

# TFOpLambda functions computing `x <op> c` for a Python number c, as (scale, offset) of c.
SCALAR_AFFINE = {
    "__operators__.add": lambda c: (1.0, c), "math.add": lambda c: (1.0, c),
    "math.subtract": lambda c: (1.0, -c), "__operators__.sub": lambda c: (1.0, -c),
    "math.multiply": lambda c: (c, 0.0), "math.truediv": lambda c: (1.0 / c, 0.0),
    "math.divide": lambda c: (1.0 / c, 0.0),
}
KERNEL_LAYERS = ("Conv2D", "DepthwiseConv2D", "Dense")
FUSED_ACTIVATIONS = ("linear", "relu")   # what a TFLite conv / dense op computes in int8


def quantizable_copy(model: Any) -> Any:
    """`model` rewritten as the module docstring says (a copy with the same weights), or
    `model` itself when there is nothing to rewrite."""
    entries = layer_entries(model)
    outputs = set(getattr(model, "output_names", ()))   # keep the model's output names
    if not any(scalar_affine(entry) or _split_activation(entry, outputs) for entry in entries):
        return model
    tf_keras = import_tf_keras()
    config = model.get_config()
    layers, renamed = [], {}
    for entry in config["layers"]:
        split = _split_activation(entry, outputs)
        if split is None:
            layers.append(_as_rescaling(entry) or entry)
            continue
        layers += split
        renamed[entry["config"]["name"]] = split[1]["config"]["name"]
    config["layers"] = [_reconnected(entry, renamed) for entry in layers]
    config["output_layers"] = _renamed_history(config["output_layers"], renamed)
    copy = tf_keras.Model.from_config(config)
    copy.set_weights(model.get_weights())   # the new layers hold no weights
    return copy


def layer_entries(model: Any) -> list[dict]:
    """The model config's layer entries (class names only for a Sequential model, which
    holds no TF-op layers)."""
    if not getattr(model, "_is_graph_network", False):
        return [{"class_name": type(layer).__name__, "config": {}} for layer in model.layers]
    return model.get_config()["layers"]


def scalar_affine(entry: dict) -> tuple[float, float] | None:
    """(scale, offset) of a TFOpLambda computing `x <op> number` on one tensor, else None."""
    if entry["class_name"] != "TFOpLambda":
        return None
    function = entry["config"].get("function")
    connection = _only_connection(entry)
    if function not in SCALAR_AFFINE or connection is None:
        return None
    kwargs = connection[3] if len(connection) > 3 else {}
    constant = kwargs.get("y")
    if set(kwargs) - {"y", "name"} or isinstance(constant, bool) \
            or not isinstance(constant, (int, float)) or (constant == 0 and "div" in function):
        return None
    return SCALAR_AFFINE[function](float(constant))


def _only_connection(entry: dict) -> list | None:
    """[layer, node, tensor, kwargs] of a layer called once on one tensor. TF-op layers store
    a call on one tensor as the bare connection, other layers as a list of connections."""
    nodes = entry.get("inbound_nodes") or []
    if len(nodes) != 1 or not nodes[0]:
        return None
    if isinstance(nodes[0][0], str):
        return nodes[0]
    return nodes[0][0] if len(nodes[0]) == 1 else None


def _as_rescaling(entry: dict) -> dict | None:
    affine = scalar_affine(entry)
    if affine is None:
        return None
    config = entry["config"]
    connection = _only_connection(entry)
    return {"class_name": "Rescaling", "name": entry.get("name", config["name"]),
            "config": {"name": config["name"], "trainable": config.get("trainable", True),
                       "dtype": config.get("dtype", "float32"),
                       "scale": affine[0], "offset": affine[1]},
            "inbound_nodes": [[[connection[0], connection[1], connection[2], {}]]]}


def _split_activation(entry: dict, outputs: set[str]) -> list[dict] | None:
    """[the conv with a linear activation, Activation(its activation)] for a conv / dense
    layer called once, not a model output, whose activation TFLite cannot fuse, else None."""
    config = entry["config"]
    activation = config.get("activation")
    if entry["class_name"] not in KERNEL_LAYERS or not isinstance(activation, str) \
            or activation in FUSED_ACTIVATIONS or len(entry.get("inbound_nodes") or []) != 1 \
            or config.get("name") in outputs:
        return None
    name = config["name"]
    conv = {**entry, "config": {**config, "activation": "linear"}}
    after = {"class_name": "Activation", "name": f"{name}/{activation}",
             "config": {"name": f"{name}/{activation}", "trainable": config.get("trainable", True),
                        "dtype": config.get("dtype", "float32"), "activation": activation},
             "inbound_nodes": [[[name, 0, 0, {}]]]}
    return [conv, after]


def _reconnected(entry: dict, renamed: dict[str, str]) -> dict:
    """`entry` reading each split conv's output from its Activation layer instead."""
    if not renamed or entry.get("name") in renamed.values():
        return entry
    return {**entry, "inbound_nodes": _renamed_history(entry.get("inbound_nodes", []), renamed)}


def _renamed_history(value: Any, renamed: dict[str, str]) -> Any:
    """Connections [layer, node, tensor, ...] anywhere in `value` with layer names renamed."""
    if isinstance(value, list):
        if len(value) >= 3 and isinstance(value[0], str) and isinstance(value[1], int):
            return [renamed.get(value[0], value[0]), value[1], value[2],
                    *(_renamed_history(item, renamed) for item in value[3:])]
        return [_renamed_history(item, renamed) for item in value]
    if isinstance(value, dict):
        return {key: _renamed_history(item, renamed) for key, item in value.items()}
    return value

"""Head pruning of tf_keras MultiHeadAttention layers: whole heads removed.

A head is its slice of the query / key / value projections (EinsumDense kernels
(d_model, heads, head_dim), biases (heads, head_dim)) and of the output projection (kernel
(heads, head_dim, d_model)). Removing a head changes none of the layer's input or output
shapes (the residual stream keeps its width), so any built-in MultiHeadAttention can lose
heads wherever it sits in the graph; the rebuilt config gets the new `num_heads`.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from compressor.backends.channel_plan import kept_channels, l2_importance

ATTENTION = "MultiHeadAttention"
PROJECTIONS = ("query", "key", "value")   # sublayer names; the output one is "attention_output"


def attention_layers(model: Any) -> list:
    """The model's own built-in MultiHeadAttention layers with more than one head."""
    return [layer for layer in model.layers if type(layer).__name__ == ATTENTION
            and type(layer).__module__.startswith("tf_keras.")
            and int(layer.get_config()["num_heads"]) > 1 and layer.get_weights()]


def head_importance(layer: Any) -> np.ndarray:
    """Per head: the L2 norm of its query / key / value / output kernel slices, each
    projection's norms divided by their mean (as l2_importance weighs layers), summed."""
    kernels = []
    for variable, value in zip(layer.weights, layer.get_weights()):
        part, kind = _part(variable)
        if kind == "kernel":
            kernels.append(np.moveaxis(value, 0 if part == "attention_output" else 1, -1))
    return l2_importance(kernels)


def kept_heads(importance: dict[str, np.ndarray], ratio: float) -> dict[str, np.ndarray]:
    """layer -> sorted indices of the heads to keep (the most important, at least one)."""
    return {name: kept_channels(values, ratio) for name, values in importance.items()}


def set_num_heads(config: dict, kept: dict[str, np.ndarray]) -> None:
    """Write each pruned layer's new head count into the model config (in place)."""
    for entry in config["layers"]:
        if entry["name"] in kept:
            entry["config"]["num_heads"] = int(len(kept[entry["name"]]))


def sliced_heads(layer: Any, weights: list[np.ndarray], heads: np.ndarray) -> list[np.ndarray]:
    """The layer's weights with the kept heads only: query / key / value kernels on axis 1
    and biases on axis 0, the output kernel on axis 0 (its bias is per output channel)."""
    sliced = []
    for variable, value in zip(layer.weights, weights):
        part, kind = _part(variable)
        if part in PROJECTIONS:
            value = np.take(value, heads, axis=1 if kind == "kernel" else 0)
        elif part == "attention_output" and kind == "kernel":
            value = np.take(value, heads, axis=0)
        sliced.append(value)
    return sliced


def heads_report(model: Any, kept: dict[str, np.ndarray]) -> tuple[dict[str, Any], ...]:
    """report.json `channel_pruning.attention_heads`: heads before / after per layer."""
    return tuple({"layer": name, "before": int(model.get_layer(name).get_config()["num_heads"]),
                  "after": int(len(heads))} for name, heads in kept.items())


def attention_macs(layer: Any) -> int:
    """Multiply-accumulates of the four projections of one sample: positions x kernel
    elements, as the artifact read-back counts them (the query-key and attention-value
    products have no constant weight and count in neither)."""
    config = layer.get_config()
    shapes = {"query": config["query_shape"], "key": config["key_shape"],
              "value": config["value_shape"], "attention_output": config["query_shape"]}
    total = 0
    for variable in layer.weights:
        part, kind = _part(variable)
        if kind == "kernel" and part in shapes and shapes[part] is not None:
            positions = int(np.prod([d or 1 for d in list(shapes[part])[1:-1]], dtype=np.int64))
            total += positions * int(np.prod(variable.shape))
    return total


def _part(variable: Any) -> tuple[str, str]:
    """("query" | "key" | "value" | "attention_output", "kernel" | "bias") of a weight."""
    parts = variable.name.split(":")[0].split("/")
    return parts[-2], parts[-1]

"""Channel pruning of Functional / Sequential tf_keras models: a smaller dense model.

channel_groups.py finds which channels go together; here each free group keeps its most
important channels (L2 norm of the Conv / Dense filters feeding it), the model is rebuilt
from its config with fewer filters / units, and every layer's weights are sliced to the
kept channels (output axis by the layer's own group, input axis by its input's layout;
BatchNorm, LayerNorm, PReLU and depthwise weights per channel; a SeparableConv's depthwise
kernel by its input, its pointwise kernel by both). MultiHeadAttention layers lose the same
ratio of their heads (attention_heads.py). Then it is fine-tuned like any other step.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from compressor.backends.channel_plan import ChannelPruning, channel_ratio, kept_channels, \
    l2_importance
import compressor.backends.keras.attention_heads as attention_heads
from compressor.backends.keras.channel_groups import (
    SEPARABLE,
    SLICED_CHANNELWISE,
    SOURCES,
    ChannelGroups,
    group_channels,
    layout_indices,
)
from compressor.backends.keras.env import import_tf_keras
from compressor.backends.keras.train import fine_tune
from compressor.errors import BackendUnavailableError, ModelLoadError, first_line
from compressor.config.steps import DistillConfig

if TYPE_CHECKING:
    from compressor.core.context import Context, ModelState
    from compressor.config.steps import PruneConfig

KERNEL_LAYERS = (*SOURCES, "DepthwiseConv2D")


def channel_pruned(state: ModelState, config: PruneConfig, ctx: Context) -> ModelState:
    """The state with a model that has `ratio` of each free group's channels removed,
    fine-tuned for `config.epochs`, and the `channel_pruning` report section (with each
    MultiHeadAttention's heads before / after: they lose `ratio` of their heads too)."""
    model = as_functional(state.model)
    groups = group_channels(model)
    roots = groups.roots()
    free = {root: info for root, info in roots.items()
            if not info["blocked"] and info["sources"] and info["size"] > 1}
    heads = {layer.name: attention_heads.head_importance(layer)
             for layer in attention_heads.attention_layers(model)}
    if not free and not heads:
        raise BackendUnavailableError(f"{model.name} has no channel group that can be pruned "
                                      "safely; use structure: unstructured for this model")
    importance = {root: l2_importance([_kernel(model.get_layer(s)) for s in info["sources"]])
                  for root, info in free.items()}

    def pruned_at(ratio: float) -> Any:
        kept = {root: kept_channels(imp, ratio, config.channel_multiple)
                for root, imp in importance.items()}
        return rebuild_with_channels(model, groups, kept,
                                     attention_heads.kept_heads(heads, ratio))

    ratio = channel_ratio(config, lambda r: keras_macs(pruned_at(r)) if r else keras_macs(model))
    description = f"channel pruning {ratio:.0%}, fine-tuning"
    pruned = fine_tune(lambda: pruned_at(ratio), model, config, ctx, description,
                       distill=state.last(DistillConfig))
    section = ChannelPruning(
        ratio=ratio, target_macs=config.target_macs, groups_pruned=len(free),
        model_before={"params": int(model.count_params()), "macs": keras_macs(model)},
        model_after={"params": int(pruned.count_params()), "macs": keras_macs(pruned)},
        kept_whole=tuple(_kept_whole(roots)), attention_heads=attention_heads.heads_report(
            model, attention_heads.kept_heads(heads, ratio)),
        widths=tuple(_widths(model, pruned, [s for info in free.values() for s in info["sources"]])))
    ctx.record.add_section(section)
    return state.replace(model=pruned)


def _widths(model: Any, pruned: Any, sources: list[str]) -> list[dict[str, Any]]:
    """Output channels before / after of each layer that makes a pruned group's channels."""
    def width(layer: Any) -> int:
        return int(getattr(layer, "filters", None) or layer.units)

    return [{"layer": name, "before": width(model.get_layer(name)),
             "after": width(pruned.get_layer(name))} for name in dict.fromkeys(sources)]


def as_functional(model: Any) -> Any:
    """A Sequential model as the equal Functional model (same layers); Functional as is."""
    tf_keras = import_tf_keras()
    if isinstance(model, tf_keras.Sequential):
        try:
            return tf_keras.Model(model.inputs, model.outputs, name=model.name)
        except (ValueError, AttributeError, TypeError) as exc:
            raise ModelLoadError(f"cannot read the graph of Sequential {model.name} "
                                 f"({first_line(exc)}); give it an Input layer") from None
    return model


def rebuild_with_channels(model: Any, groups: ChannelGroups, kept: dict[int, np.ndarray],
                          heads: dict[str, np.ndarray] | None = None) -> Any:
    """A new Functional model with the kept channels (and attention heads: layer -> kept
    head indices) only, its weights sliced from `model`'s."""
    tf_keras = import_tf_keras()
    heads = heads or {}
    config = model.get_config()
    attention_heads.set_num_heads(config, heads)
    for entry in config["layers"]:
        name = entry["name"]
        if entry["class_name"] in SOURCES and name in groups.outputs and \
                groups.outputs[name][0] == "channels":
            (group, _), = groups.outputs[name][1]
            if groups.find(group) in kept:
                key = "units" if entry["class_name"] == "Dense" else "filters"
                entry["config"][key] = int(len(kept[groups.find(group)]))
    # Custom layer classes only: passing built-in ones swaps in other variants (BatchNorm V1).
    custom = {type(layer).__name__: type(layer) for layer in model.layers
              if not type(layer).__module__.startswith("tf_keras.")}
    try:
        rebuilt = tf_keras.Model.from_config(config, custom_objects=custom)
    except (TypeError, ValueError, KeyError) as exc:
        raise BackendUnavailableError(f"cannot rebuild {model.name} with fewer channels "
                                      f"({first_line(exc)}); use structure: unstructured") from None
    for layer in rebuilt.layers:
        old = model.get_layer(layer.name)
        weights = old.get_weights()
        if weights and layer.name in heads:
            layer.set_weights(attention_heads.sliced_heads(old, weights, heads[layer.name]))
        elif weights:
            layer.set_weights(_sliced(old, weights, groups, kept))
    return rebuilt


def _sliced(layer: Any, weights: list[np.ndarray], groups: ChannelGroups,
            kept: dict[int, np.ndarray]) -> list[np.ndarray]:
    kind, name = type(layer).__name__, layer.name
    layout_in, layout_out = groups.inputs.get(name), groups.outputs.get(name)
    if kind in SOURCES and layout_in is not None:
        rows = layout_indices(layout_in, kept, groups)
        cols = layout_indices(layout_out, kept, groups)
        if kind in SEPARABLE:   # depthwise (k.., in, 1), pointwise (1.., in, out), bias
            depthwise, pointwise, *bias = weights
            pointwise = np.take(np.take(pointwise, rows, axis=-2), cols, axis=-1)
            return [np.take(depthwise, rows, axis=-2), pointwise,
                    *(np.take(b, cols, axis=-1) for b in bias)]
        kernel = np.take(np.take(weights[0], rows, axis=-2), cols, axis=-1)
        return [kernel, *(np.take(w, cols, axis=-1) for w in weights[1:])]
    if kind in SLICED_CHANNELWISE and layout_in is not None:
        channels = layout_indices(layout_in, kept, groups)
        if kind == "DepthwiseConv2D":
            return [np.take(weights[0], channels, axis=2),
                    *(np.take(w, channels, axis=-1) for w in weights[1:])]
        # PReLU's alpha has 1 on its shared axes: one alpha for all channels stays as is
        return [np.take(w, channels, axis=-1) if w.shape[-1] > 1 else w for w in weights]
    return weights


def keras_macs(model: Any) -> int:
    """Multiply-accumulates of one sample: output positions x kernel elements per conv /
    depthwise / separable / dense layer and attention projection (as
    runtimes.common.kernel_macs counts an artifact)."""
    total = 0
    for layer in _leaf_layers(model):
        kind = type(layer).__name__
        if kind == attention_heads.ATTENTION and layer.weights:
            total += attention_heads.attention_macs(layer)
        elif kind in KERNEL_LAYERS and layer.weights:
            shape = layer.output_shape
            positions = int(np.prod([d or 1 for d in shape[1:-1]], dtype=np.int64))
            kernels = layer.weights[:2] if kind in SEPARABLE else layer.weights[:1]
            total += positions * sum(int(np.prod(w.shape)) for w in kernels)
    return total


def _kernel(layer: Any) -> np.ndarray:
    """The kernel with output channels last (Conv: (k.., in, out), Dense: (in, out),
    SeparableConv: its pointwise kernel)."""
    weights = layer.get_weights()
    if type(layer).__name__ in SEPARABLE:
        return weights[1]
    if type(layer).__name__ in SOURCES:
        return weights[0]
    raise BackendUnavailableError(f"layer {layer.name} has no kernel to rank channels by")


def _kept_whole(roots: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Blocked groups with Conv / Dense layers in them: what the report lists as left whole."""
    return [{"layers": sorted(info["sources"]), "reason": "; ".join(sorted(info["blocked"]))}
            for info in roots.values() if info["blocked"] and info["sources"]]


def _leaf_layers(model: Any) -> list:
    return [leaf for layer in model.layers
            for leaf in (_leaf_layers(layer) if hasattr(layer, "layers") else [layer])]

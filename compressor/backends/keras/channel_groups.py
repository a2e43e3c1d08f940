"""Which channels of a Functional tf_keras model must be removed together.

Every Conv / Dense / SeparableConv output starts a channel group. BatchNorm, LayerNorm over
the last axis, PReLU, depthwise convs and per-channel layers (activations, pooling, padding)
pass their input's channels through;
Add / Multiply / ... join the groups of their inputs (a residual sum keeps one channel set);
Concatenate lays groups side by side; Flatten repeats them per position. A group is
"blocked" (left whole) when it reaches the model's inputs or outputs (e.g. the classifier
head), a shared layer, or a layer this walk does not know (custom layers, reshapes, tensor
operators, MultiHeadAttention's inputs and outputs: attention_heads.py prunes its heads).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

CONVS = ("Conv1D", "Conv2D", "Conv3D")
SEPARABLE = ("SeparableConv1D", "SeparableConv2D")   # depthwise per input channel + pointwise
SOURCES = (*CONVS, *SEPARABLE, "Dense")
PER_CHANNEL = {"ReLU", "LeakyReLU", "ELU", "ThresholdedReLU", "Dropout",
               "SpatialDropout1D", "SpatialDropout2D", "GaussianNoise", "GaussianDropout",
               "AlphaDropout", "MaxPooling1D", "MaxPooling2D", "AveragePooling1D",
               "AveragePooling2D", "GlobalAveragePooling1D", "GlobalAveragePooling2D",
               "GlobalMaxPooling1D", "GlobalMaxPooling2D", "ZeroPadding1D", "ZeroPadding2D",
               "Cropping1D", "Cropping2D", "UpSampling1D", "UpSampling2D", "ActivityRegularization"}
MERGES = {"Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum"}
# weights sliced per channel on their last axis (DepthwiseConv2D: the kernel's axis 2)
SLICED_CHANNELWISE = {"BatchNormalization", "LayerNormalization", "PReLU", "DepthwiseConv2D"}

# A layout: the channels of one tensor as segments (group id, size), last axis; or a
# flattened tensor: ("flat", positions, segments), channel-last within each position.
Segments = tuple[tuple[int, int], ...]


@dataclass
class ChannelGroups:
    """The result of the walk: groups (union-find), their sources, and the layout of every
    layer's input (what its weights' input axis must be sliced by) and output."""

    parent: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    sources: dict[int, list[str]] = field(default_factory=dict)       # group -> Conv/Dense names
    blocked: dict[int, set[str]] = field(default_factory=dict)        # group -> reasons
    members: dict[int, set[str]] = field(default_factory=dict)        # group -> layer names
    inputs: dict[str, Any] = field(default_factory=dict)              # layer -> input layout
    outputs: dict[str, Any] = field(default_factory=dict)             # layer -> output layout

    def new(self, size: int, layer: str) -> int:
        self.parent.append(len(self.parent))
        self.sizes.append(size)
        self.members[len(self.parent) - 1] = {layer}
        return len(self.parent) - 1

    def find(self, group: int) -> int:
        while self.parent[group] != group:
            self.parent[group] = self.parent[self.parent[group]]
            group = self.parent[group]
        return group

    def union(self, a: int, b: int) -> None:
        a, b = self.find(a), self.find(b)
        if a != b:
            self.parent[b] = a

    def block(self, layout: Any, reason: str) -> None:
        for group, _ in segments_of(layout):
            self.blocked.setdefault(group, set()).add(reason)

    def roots(self) -> dict[int, dict[str, Any]]:
        """root -> {"size", "sources", "layers", "blocked": reasons} after all unions."""
        found: dict[int, dict[str, Any]] = {}
        for group in range(len(self.parent)):
            root = found.setdefault(self.find(group), {"size": self.sizes[group], "sources": [],
                                                       "layers": set(), "blocked": set()})
            root["sources"] += self.sources.get(group, [])
            root["layers"] |= self.members.get(group, set())
            root["blocked"] |= self.blocked.get(group, set())
        return found


def segments_of(layout: Any) -> Segments:
    return layout[2] if layout and layout[0] == "flat" else layout[1]


def group_channels(model: Any) -> ChannelGroups:
    """Walk a Functional model's config (layers in topological order) and group its channels."""
    config = model.get_config()
    layers = {layer.name: layer for layer in model.layers}
    groups = ChannelGroups()
    for entry in config["layers"]:
        name, kind = entry["name"], entry["class_name"]
        nodes = entry.get("inbound_nodes", [])
        layer = layers[name]
        if kind == "InputLayer":
            groups.outputs[name] = _fresh(groups, layer, name, "a model input")
            continue
        inbound = _inbound_names(nodes)
        if len(nodes) != 1 or inbound is None or any(n not in groups.outputs for n in inbound):
            for n in sorted(_referenced_names(nodes) & groups.outputs.keys()):
                groups.block(groups.outputs[n], f"feeds {name}, which is shared or not "
                             "a plain layer call")
            groups.outputs[name] = _fresh(groups, layer, name, f"made by {name}, a shared layer")
            continue
        ins = [groups.outputs[n] for n in inbound]
        groups.inputs[name] = ins[0] if len(ins) == 1 else None
        groups.outputs[name] = _layer_output(groups, layer, kind, entry["config"], name, ins)
    for output in config["output_layers"]:
        groups.block(groups.outputs[output[0]], "a model output (e.g. the classifier head)")
    return groups


def _inbound_names(nodes: list) -> list[str] | None:
    """Layer names feeding the layer's one call, or None for a node form we do not parse."""
    if len(nodes) != 1 or not isinstance(nodes[0], list):
        return None
    names = []
    for item in nodes[0]:
        if not isinstance(item, list) or not item or not isinstance(item[0], str) or item[2] != 0:
            return None
        if len(item) > 3 and item[3]:
            return None   # keyword arguments (masks, tensors): not a plain call
        names.append(item[0])
    return names


def _referenced_names(nodes: Any) -> set[str]:
    """Every layer name a node form refers to, keyword arguments included (a TFOpLambda's
    `x + y` passes y as a keyword, MultiHeadAttention its value)."""
    if isinstance(nodes, dict):
        return {name for value in nodes.values() for name in _referenced_names(value)}
    if not isinstance(nodes, list):
        return set()
    if len(nodes) >= 3 and isinstance(nodes[0], str) and isinstance(nodes[1], int):
        return {nodes[0]} | _referenced_names(nodes[3:])
    return {name for item in nodes for name in _referenced_names(item)}


def _fresh(groups: ChannelGroups, layer: Any, name: str, reason: str) -> Any:
    shape = layer.output_shape[0] if isinstance(layer.output_shape, list) else layer.output_shape
    layout = ("channels", ((groups.new(int(shape[-1] or 1), name), int(shape[-1] or 1)),))
    groups.block(layout, reason)
    return layout


def _layer_output(groups: ChannelGroups, layer: Any, kind: str, config: dict, name: str,
                  ins: list) -> Any:
    single = ins[0] if len(ins) == 1 else None
    channels_in = single is not None and single[0] == "channels"
    if kind in SOURCES and single is not None and (channels_in or kind == "Dense") \
            and config.get("groups", 1) == 1 and config.get("depth_multiplier", 1) == 1:
        size = int(config["units" if kind == "Dense" else "filters"])
        group = groups.new(size, name)
        groups.sources[group] = [name]
        return ("channels", ((group, size),))
    if channels_in and (kind in PER_CHANNEL or _passes_channels(kind, config, layer)):
        for group, _ in single[1]:
            groups.members[group].add(name)
        return single
    if kind in MERGES and all(i[0] == "channels" for i in ins) and _same_cut(ins):
        for other in ins[1:]:
            for (a, _), (b, _) in zip(ins[0][1], other[1]):
                groups.union(a, b)
        return ins[0]
    rank = len(layer.output_shape) if not isinstance(layer.output_shape, list) else 0
    if kind == "Concatenate" and all(i[0] == "channels" for i in ins) \
            and config.get("axis", -1) in (-1, rank - 1):
        return ("channels", tuple(seg for i in ins for seg in i[1]))
    if kind == "Flatten" and channels_in:
        positions = int(np.prod(layer.input_shape[1:-1], dtype=np.int64))
        return ("flat", positions, single[1]) if positions > 1 else single
    if kind in ("Dropout", "Activation") and single is not None and single[0] == "flat" \
            and config.get("activation") != "softmax":
        return single
    for layout in ins:
        groups.block(layout, f"read by {name} ({kind}), which is not pruned channel-wise")
    return _fresh(groups, layer, name, f"made by {name} ({kind})")


def _passes_channels(kind: str, config: dict, layer: Any) -> bool:
    if kind == "Activation":
        return config.get("activation") not in ("softmax", "log_softmax")
    if kind == "PReLU":
        return True   # alpha is per channel or shared across them (shared_axes)
    if kind in ("BatchNormalization", "LayerNormalization"):
        axis = config.get("axis", -1)
        axis = axis[0] if isinstance(axis, list) and len(axis) == 1 else axis
        return axis in (-1, len(layer.input_shape) - 1)
    if kind == "DepthwiseConv2D":
        return config.get("depth_multiplier", 1) == 1
    return False


def _same_cut(ins: list) -> bool:
    """Merged inputs must be cut into the same segment sizes to be joined position by position."""
    sizes = [tuple(size for _, size in layout[1]) for layout in ins]
    return all(s == sizes[0] for s in sizes)


def layout_indices(layout: Any, kept: dict[int, np.ndarray], groups: ChannelGroups) -> np.ndarray:
    """Indices into the unpruned axis that survive, for a channels or flat layout."""
    def channel_indices(segments: Segments) -> np.ndarray:
        parts, offset = [], 0
        for group, size in segments:
            parts.append(offset + kept.get(groups.find(group), np.arange(size)))
            offset += size
        return np.concatenate(parts) if parts else np.arange(0)

    if layout[0] == "flat":
        _, positions, segments = layout
        inner = channel_indices(segments)
        width = sum(size for _, size in segments)
        return (np.arange(positions)[:, None] * width + inner[None, :]).reshape(-1)
    return channel_indices(layout[1])

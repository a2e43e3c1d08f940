"""Activation outliers moved into the weights before dynamic int8 (SmoothQuant, Xiao et al.
2023), on an ONNX graph.

Dynamic int8 quantizes each MatMul's input with one scale for the whole tensor, found at run
time. Trained transformers carry a few channels far larger than the rest (pretrained BERTs'
outlier dimensions, tens of times the median channel after a LayerNorm), so that one scale
leaves the ordinary channels a handful of int8 steps. For every activation read by MatMuls
with constant weights, channel j is divided by

    s_j = sqrt(max|x_j| / max|W_j,:|)

(max|x_j| measured on calibration batches, W_j,: row j of every weight that reads x) and those
weight rows are multiplied by s_j: the float function is unchanged, activation and weight
ranges are balanced per channel, and the per-column int8 weight scales take up the rest (an
outlier channel's weight row, now the largest in its columns, is stored the most precisely).
The division is one Mul on the branch that feeds the MatMuls: a post-LayerNorm BERT's residual
path reads the same tensor unscaled.
"""
from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np

# Migration strength: 0.5 (the square root above) is the paper's default for BERT-sized
# models. Measured on encoders with outlier channels seeded 10x-100x (bench transformer case,
# tests/export/test_onnx_smooth.py): 0.5 as good as picking 0, 0.25, 0.5 or 0.75 per
# activation by the int8 error each left on the calibration batches.
ALPHA = 0.5
SCALE_LIMITS = (1e-3, 1e3)     # a dead channel (max 0) must not blow its weight row up
# Only activations with outliers are smoothed: a channel peak this many times the median
# channel's. Each smoothed activation costs a Mul at run time (measured: 3% of a 6-layer
# BERT's int8 batch-1 time when all 24 were smoothed); a trained encoder's LayerNorm outputs
# reach 10x-50x, while attention contexts, GELU outputs and a random-init model's
# activations stay under 5x, where smoothing gained nothing measurable.
OUTLIER_RATIO = 8.0


def smoothed(prepared: Path, feeds: Sequence[dict[str, np.ndarray]],
             exclude_nodes: Collection[str], target: Path) -> Path:
    """`prepared` with its activation outliers moved into the weights, saved as `target` (or
    `prepared` itself when no activation has outliers). `feeds`: calibration batches, each
    input name -> array of the dtype the model declares."""
    import onnx

    proto = onnx.load(str(prepared))
    groups = smoothing_groups(proto, exclude_nodes)
    if not groups:
        return prepared
    peaks = activation_peaks(proto, feeds, list(groups))
    groups = {name: nodes for name, nodes in groups.items()
              if peaks[name].max() >= OUTLIER_RATIO * max(float(np.median(peaks[name])), 1e-12)}
    if not groups:
        return prepared
    smooth_graph(proto, groups, peaks)
    onnx.save(proto, str(target))
    return target


def smoothing_groups(proto: Any, exclude_nodes: Collection[str] = ()) -> dict[str, list[Any]]:
    """Activation name -> the MatMul nodes (not in `exclude_nodes`) that read it as input 0
    with a 2-D float32 constant as input 1."""
    from onnx import TensorProto

    initializers = {init.name: init for init in proto.graph.initializer}
    groups: dict[str, list[Any]] = {}
    for node in proto.graph.node:
        weight = initializers.get(node.input[1]) if node.op_type == "MatMul" else None
        if weight is None or node.name in exclude_nodes or len(weight.dims) != 2 or \
                weight.data_type != TensorProto.FLOAT or node.input[0] in initializers:
            continue
        groups.setdefault(node.input[0], []).append(node)
    return groups


def activation_peaks(model: Any, batches: Sequence[dict[str, np.ndarray]],
                     names: Sequence[str]) -> dict[str, np.ndarray]:
    """max |value| per channel (the last axis) of each named tensor of `model` (left as it
    is) over the batches."""
    import onnx
    import onnxruntime as ort

    proto = type(model)()
    proto.CopyFrom(model)
    present = {value.name for value in proto.graph.output}
    proto.graph.output.extend(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
                              for name in names if name not in present)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(proto.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    peaks: dict[str, np.ndarray] = {}
    for batch in batches:
        for name, value in zip(names, session.run(list(names), batch)):
            peak = np.abs(value.reshape(-1, value.shape[-1])).max(axis=0)
            peaks[name] = np.maximum(peaks[name], peak) if name in peaks else peak
    return peaks


def smooth_scales(peak: np.ndarray, weights: Sequence[np.ndarray]) -> np.ndarray:
    """s_j for one activation (per-channel |max| `peak`) and the weights that read it."""
    weight_peak = np.max([np.abs(w).max(axis=1) for w in weights], axis=0)
    scale = np.maximum(peak, 1e-8) ** ALPHA / np.maximum(weight_peak, 1e-8) ** (1 - ALPHA)
    return np.clip(scale, *SCALE_LIMITS).astype(np.float32)


def smooth_graph(proto: Any, groups: dict[str, list[Any]], peaks: dict[str, np.ndarray]) -> None:
    """Divide each group's activation by its scales (one Mul) and scale the rows of the
    group's weights to match, in place. A weight another node also reads gets a copy."""
    from onnx import helper, numpy_helper

    graph = proto.graph
    initializers = {init.name: init for init in graph.initializer}
    replaced = set()
    for activation, nodes in groups.items():
        names = list(dict.fromkeys(node.input[1] for node in nodes))
        weights = [numpy_helper.to_array(initializers[name]).astype(np.float32) for name in names]
        scale = smooth_scales(peaks[activation], weights)
        base = f"{activation}_smoothed"
        graph.initializer.append(numpy_helper.from_array(1 / scale, f"{base}_inverse_scale"))
        graph.initializer.extend(numpy_helper.from_array(weight * scale[:, None], f"{name}_{base}")
                                 for name, weight in zip(names, weights))
        for node in nodes:
            node.input[0], node.input[1] = base, f"{node.input[1]}_{base}"
        first = min(list(graph.node).index(node) for node in nodes)
        graph.node.insert(first, helper.make_node("Mul", [activation, f"{base}_inverse_scale"],
                                                  [base], name=f"{base}_mul"))
        replaced.update(names)
    readers = {name for node in graph.node for name in node.input}
    for init in [initializers[name] for name in replaced if name not in readers]:
        graph.initializer.remove(init)

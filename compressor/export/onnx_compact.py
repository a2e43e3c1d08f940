"""The bytes of an ONNX file that are not the model: what every saved graph drops, and what a
quantized one stores narrower.

On a small encoder (bench bert2x64, 144k parameters) the int8 file's weights were 136.6 kB of
173.7 kB: converters' tensor names (`node_MatMul_74_quant_scales_mul:0`), shape annotations
(value_info) that runtimes infer again, empty fields written explicitly (ONNX is proto2), and
float32 side parameters (biases, scales, LayerNorm) beside int8 weights made up the rest.
"""
from __future__ import annotations

import copy
import re
from typing import Any

import numpy as np

# ops whose float inputs may come from a Cast of a float16 initializer: onnxruntime folds the
# Cast at load; kernels that pre-pack constant inputs (MatMulNBits, QDQ weights) are left out
SIDE_PARAM_READERS = frozenset({"Add", "Mul", "Sub", "Div", "LayerNormalization", "Gather"})
MIN_SIDE_ELEMENTS = 16          # below it the Cast node costs more than float16 saves
FLOAT16_TINY, FLOAT16_MAX = 2.0 ** -14, 65504.0   # normal float16: relative error <= 2^-11
GENERATED_SUFFIX = re.compile(r"__\d+")   # tf2onnx's make_name counter, e.g. scale__63


def compact(proto: Any) -> None:
    """In place, nothing computed changes: internal tensors get short names in node order
    (graph inputs and outputs keep theirs), value_info goes (onnxruntime and our inspection
    infer shapes), empty strings written explicitly are cleared, and opset imports no node uses
    are dropped. Only nodes reading a weight (an initializer of 2 or more dimensions) keep
    their names: inspection names a weight by the node that reads it. Converters number names
    from process-wide counters and merge duplicate constants in varying order, so the names
    (generated `name__N` node names renumbered in node order too) and the initializers' order
    (by first use) are set here: the same model gives the same bytes each run."""
    graph = proto.graph
    if any(attr.g.node or attr.graphs for node in graph.node for attr in node.attribute):
        return   # subgraphs (If / Loop) read outer names: left as they are
    weights = {init.name for init in graph.initializer if len(init.dims) >= 2}
    first_use: dict[str, int] = {}
    for index, node in enumerate(graph.node):
        for name in node.input:
            first_use.setdefault(name, len(first_use))
        if not weights.intersection(node.input):
            node.ClearField("name")
        elif GENERATED_SUFFIX.search(node.name):
            node.name = f"{GENERATED_SUFFIX.sub('', node.name)}__n{index}"
    ordered = sorted(graph.initializer, key=lambda init: (first_use.get(init.name, len(first_use)),
                                                          init.name))
    ordered = [copy.deepcopy(init) for init in ordered]
    del graph.initializer[:]
    graph.initializer.extend(ordered)
    keep = {value.name for value in (*graph.input, *graph.output)}
    short: dict[str, str] = {}

    def renamed(name: str) -> str:
        if not name or name in keep:
            return name
        return short.setdefault(name, format(len(short), "x"))

    for node in graph.node:
        node.input[:] = [renamed(name) for name in node.input]
        node.output[:] = [renamed(name) for name in node.output]
        for field in ("doc_string", "domain"):
            if node.HasField(field) and not getattr(node, field):
                node.ClearField(field)
    for init in graph.initializer:
        init.name = renamed(init.name)
    del graph.value_info[:]
    for field in ("doc_string", "producer_version", "domain"):
        if proto.HasField(field) and not getattr(proto, field):
            proto.ClearField(field)
    used = {node.domain for node in graph.node}
    opsets = [o for o in proto.opset_import if o.domain in used or o.domain in ("", "ai.onnx")]
    del proto.opset_import[:]
    proto.opset_import.extend(opsets)


def float16_side_params(proto: Any) -> int:
    """Float32 vectors (at most one dimension over 1) of a quantized graph that only
    element-wise ops, LayerNorm and Gather read (biases, per-channel scales, LayerNorm weights,
    a table's row scales) stored as float16 behind a Cast, where every value is a normal
    float16 (relative error <= 2^-11, ~1/16 of an int8 step): in place; returns how many.
    Tables stay float32 (a BERT's 2 token-type rows: every token would carry their error)."""
    from onnx import TensorProto, helper, numpy_helper

    graph = proto.graph
    readers: dict[str, set[str]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, set()).add(node.op_type)
    casts = []
    for init in graph.initializer:
        if (init.data_type != TensorProto.FLOAT or not readers.get(init.name)
                or not readers[init.name] <= SIDE_PARAM_READERS
                or sum(dim > 1 for dim in init.dims) > 1):
            continue
        values = numpy_helper.to_array(init)
        magnitudes = np.abs(values[values != 0])
        if values.size < MIN_SIDE_ELEMENTS or (magnitudes.size and (
                magnitudes.min() < FLOAT16_TINY or magnitudes.max() > FLOAT16_MAX)):
            continue
        name = init.name
        init.CopyFrom(numpy_helper.from_array(values.astype(np.float16), f"{name}_f16"))
        casts.append(helper.make_node("Cast", [init.name], [name], to=TensorProto.FLOAT))
    if casts:
        nodes = [*casts, *graph.node]
        del graph.node[:]
        graph.node.extend(nodes)
    return len(casts)


def drop_zero_weight_zero_points(proto: Any) -> int:
    """MatMulInteger / ConvInteger weight zero points that are all 0 (symmetric weights)
    removed: 0 is the op's default. In place; returns how many."""
    from onnx import numpy_helper

    graph = proto.graph
    inits = {init.name: init for init in graph.initializer}
    dropped = set()
    for node in graph.node:
        if node.op_type in ("MatMulInteger", "ConvInteger") and len(node.input) == 4 \
                and node.input[3] in inits and not numpy_helper.to_array(inits[node.input[3]]).any():
            dropped.add(node.input[3])
            del node.input[3]
    still_read = {name for node in graph.node for name in node.input}
    unused = [init for init in graph.initializer if init.name in dropped - still_read]
    for init in unused:
        graph.initializer.remove(init)
    return len(dropped)


def narrow_side_params(proto: Any) -> None:
    """What a quantized graph stores beside its integer weights, narrower (in place)."""
    float16_side_params(proto)
    drop_zero_weight_zero_points(proto)

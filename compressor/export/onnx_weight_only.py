"""int8 weight storage in ONNX graphs that keep float compute: each float32 weight becomes a
per-channel symmetric int8 initializer feeding a DequantizeLinear (zero point 0, so pruned
zeros stay exact zeros).

Covers Conv / ConvTranspose / MatMul / Gemm weights, Gather (embedding) tables (one scale
per row; the int8 rows are gathered first and scaled after, so a run touches only the rows
it looks up), LSTM / GRU / RNN W and R (one scale per gate row), and constant tables added
to activations (position embeddings folded out of their Gather, `store_int8_tables`). Used whole by
`quantize_onnx_weight_only`, and for the embedding tables after `quantize_onnx_dynamic`
(onnxruntime's dynamic Gather would store them as uint8 with one scale for the table).
"""
from __future__ import annotations

import tempfile
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from compressor.errors import BackendUnavailableError

WEIGHT_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm", "Gather", "LSTM", "GRU", "RNN")
MIN_OPSET = 13   # per-axis DequantizeLinear
# Constant tables read by elementwise ops: a position-embedding slice the exporter folded
# out of its Gather (`position_embeddings(arange(T))` -> a [1, T, D] constant added to the
# token embeddings), a ViT's position table. As large as the read-back gate's matrices
# (validate.MATRIX_ELEMENTS); smaller ones (class tokens, norms, biases) stay float.
TABLE_ELEMENTS = 1024
TABLE_READERS = ("Add", "Sub", "Mul", "Concat")
# Larger magnitudes are masks and sentinels (-1e4, float32 min), not learned values.
TABLE_MAX_ABS = 1e3


def weight_only_int8(source: Path, target: Path, exclude_nodes: Sequence[str] = ()) -> None:
    """The whole weight-only route, after constant folding (weights behind Transpose etc.)."""
    import onnx

    from compressor.export.onnx_prepare import prepared_names, preprocessed

    with tempfile.TemporaryDirectory(prefix="onnx-quant-", dir=Path(target).parent) as tmp:
        prepared = preprocessed(Path(source), Path(tmp) / "prepared.onnx")
        excluded = set(prepared_names(prepared, exclude_nodes))
        proto = onnx.load(str(prepared))
    store_int8_weights(proto, excluded, WEIGHT_OPS)
    store_int8_tables(proto, excluded)
    onnx.save(proto, str(target))


def store_int8_weights(proto: Any, exclude_nodes: Collection[str],
                       op_types: Collection[str]) -> int:
    """Replace the float32 weights of `op_types` nodes (not in `exclude_nodes`) by int8 +
    DequantizeLinear, in place; returns how many weights were replaced."""
    from onnx import helper, numpy_helper

    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < MIN_OPSET:
        raise BackendUnavailableError(f"int8 weights behind DequantizeLinear need ONNX opset "
                                      f">= {MIN_OPSET}, the model has {opset}; export it with "
                                      f"opset {MIN_OPSET} or later")
    graph = proto.graph
    initializers = {init.name: init for init in graph.initializer}
    stored: dict[tuple[str, int], str] = {}    # (weight, axis) -> int8 initializer name
    dequantized: dict[str, str] = {}           # int8 initializer -> DequantizeLinear output
    new_nodes: list[tuple[Any, Any, int]] = []   # (node, the node it goes beside, 0 before / 1 after)
    for node in graph.node:
        if node.op_type not in op_types or node.name in exclude_nodes:
            continue
        for index, axis in _weight_axes(node, initializers):
            name = node.input[index]
            if (name, axis) not in stored:
                quantized, scale = symmetric_int8(numpy_helper.to_array(initializers[name]), axis)
                seen = any(weight == name for weight, _ in stored)
                base = f"{name}_int8_axis{axis}" if seen else f"{name}_int8"
                graph.initializer.extend([numpy_helper.from_array(quantized, base),
                                          numpy_helper.from_array(scale, f"{base}_scale")])
                stored[(name, axis)] = base
            base = stored[(name, axis)]
            if node.op_type == "Gather" and index == 0:
                new_nodes += [(made, node, 1) for made in _gather_rows_first(
                    node, base, len(initializers[name].dims) - axis - 1)]
                continue
            if base not in dequantized:
                dequantized[base] = f"{base}_dequantized"
                new_nodes.append((helper.make_node(
                    "DequantizeLinear", [base, f"{base}_scale"], [dequantized[base]],
                    name=f"{base}_dequantize", axis=axis), node, 0))
            node.input[index] = dequantized[base]
    for made, anchor, after in reversed(new_nodes):   # beside their anchors: still sorted
        graph.node.insert(list(graph.node).index(anchor) + after, made)
    _fold_shapes_of(graph, {weight: initializers[weight] for weight, _ in stored})
    readers = {name for node in graph.node for name in node.input} | \
        {value.name for value in graph.output}
    for name in {weight for weight, _ in stored}:
        if name not in readers:
            graph.initializer.remove(initializers[name])
    return len(stored)


def store_int8_tables(proto: Any, exclude_nodes: Collection[str] = ()) -> int:
    """Replace, in place, each float32 constant table (>= TABLE_ELEMENTS elements, two axes
    longer than 1 (not a [1, C] bias), finite, |values| <= TABLE_MAX_ABS) read only by
    TABLE_READERS nodes not in `exclude_nodes` by an int8 initializer with one scale per row
    (the second-to-last axis: a position's vector) feeding a DequantizeLinear; returns how
    many were replaced."""
    from onnx import TensorProto, helper, numpy_helper

    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < MIN_OPSET:
        return 0   # per-axis DequantizeLinear does not exist: the gate names what stayed float
    graph = proto.graph
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    boundary = {value.name for value in (*graph.input, *graph.output)}
    replaced = 0
    for init in list(graph.initializer):
        users = readers.get(init.name, [])
        if init.data_type != TensorProto.FLOAT or sum(d > 1 for d in init.dims) < 2 \
                or init.name in boundary \
                or int(np.prod(init.dims)) < TABLE_ELEMENTS or not users or \
                any(u.op_type not in TABLE_READERS or u.name in exclude_nodes for u in users):
            continue
        values = numpy_helper.to_array(init)
        if not np.all(np.isfinite(values)) or float(np.max(np.abs(values))) > TABLE_MAX_ABS:
            continue
        axis = values.ndim - 2
        quantized, scale = symmetric_int8(values, axis)
        base = f"{init.name}_int8"
        graph.initializer.remove(init)
        graph.initializer.extend([numpy_helper.from_array(quantized, base),
                                  numpy_helper.from_array(scale, f"{base}_scale")])
        # Same output name: every reader now gets the dequantized table.
        graph.node.insert(0, helper.make_node("DequantizeLinear", [base, f"{base}_scale"],
                                              [init.name], name=f"{base}_dequantize", axis=axis))
        replaced += 1
    return replaced


def _fold_shapes_of(graph: Any, weights: dict[str, Any]) -> None:
    """Shape(weight) nodes become constants, so a weight read only by its int8 copy and by
    shape arithmetic (tf2onnx writes Keras attention kernels so) leaves no float copy."""
    import numpy as np
    from onnx import numpy_helper

    for node in [n for n in graph.node if n.op_type == "Shape" and n.input[0] in weights]:
        attrs = {a.name: a.i for a in node.attribute}
        dims = list(weights[node.input[0]].dims)
        shape = np.array(dims[attrs.get("start", 0):attrs.get("end", len(dims))], np.int64)
        graph.initializer.append(numpy_helper.from_array(shape, node.output[0]))
        graph.node.remove(node)


def _gather_rows_first(node: Any, base: str, trailing: int) -> list[Any]:
    """Rewire the table lookup `node` to gather int8 rows and their scales, then multiply:
    Cast(Gather(int8, ids)) * Gather(scale, ids). Dequantizing the whole table before the
    Gather (DequantizeLinear -> Gather) costs a pass over every row on every run: on a
    30k x 384 vocabulary that was most of a 6-layer BERT's batch-1 time."""
    from onnx import TensorProto, helper, numpy_helper

    output, ids = node.output[0], node.input[1]
    rows = f"{output}_int8_rows"   # (a converter's names such as x_scale are taken)
    node.input[0], node.output[0] = base, rows
    made = [helper.make_node("Cast", [rows], [f"{rows}_float"],
                             name=f"{node.name}_cast", to=TensorProto.FLOAT),
            helper.make_node("Gather", [f"{base}_scale", ids], [f"{rows}_scale"],
                             name=f"{node.name}_scale", axis=0)]
    scale = f"{rows}_scale"
    if trailing:   # the scale of each gathered row broadcasts over the row's own axes
        axes = numpy_helper.from_array(np.arange(-trailing, 0, dtype=np.int64),
                                       f"{rows}_scale_axes")
        made.append(helper.make_node("Constant", [], [axes.name], name=f"{node.name}_axes",
                                     value=axes))
        made.append(helper.make_node("Unsqueeze", [scale, axes.name], [f"{scale}_rows"],
                                     name=f"{node.name}_unsqueeze"))
        scale = f"{scale}_rows"
    return made + [helper.make_node("Mul", [f"{rows}_float", scale], [output],
                                    name=f"{node.name}_dequantize")]


def symmetric_int8(values: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel (along `axis`) symmetric int8 in [-127, 127]; an all-zero channel gets
    scale 1 so it stays zero."""
    others = tuple(i for i in range(values.ndim) if i != axis)
    peak = np.max(np.abs(values), axis=others).astype(np.float32)
    scale = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
    shape = [1] * values.ndim
    shape[axis] = -1
    quantized = np.clip(np.round(values / scale.reshape(shape)), -127, 127).astype(np.int8)
    return quantized, scale


def _weight_axes(node: Any, initializers: dict[str, Any]) -> list[tuple[int, int]]:
    """(input index, channel axis) of each float32 constant weight of `node`."""
    from onnx import TensorProto

    def weight(index: int) -> Any:
        name = node.input[index] if index < len(node.input) else ""
        init = initializers.get(name)
        ok = init is not None and init.data_type == TensorProto.FLOAT and len(init.dims) >= 2
        return init if ok else None

    attrs = {a.name: a for a in node.attribute}
    found: list[tuple[int, int]] = []
    if node.op_type == "Conv" and weight(1) is not None:
        found.append((1, 0))
    elif node.op_type == "ConvTranspose" and weight(1) is not None:
        found.append((1, 1))
    elif node.op_type == "MatMul":
        if weight(1) is not None:
            found.append((1, len(weight(1).dims) - 1))        # output columns
        elif weight(0) is not None:
            found.append((0, len(weight(0).dims) - 2))        # output rows
    elif node.op_type == "Gemm" and weight(1) is not None:
        found.append((1, 0 if "transB" in attrs and attrs["transB"].i else 1))
    elif node.op_type == "Gather" and weight(0) is not None and \
            int(np.prod(weight(0).dims)) >= TABLE_ELEMENTS:
        # A smaller table (a BERT's 2 token types) is read the same way by every token, so its
        # rounding error is systematic, and it is too small for the int8 gate: it stays float.
        axis = attrs["axis"].i if "axis" in attrs else 0
        found.append((0, axis % len(weight(0).dims)))
    elif node.op_type in ("LSTM", "GRU", "RNN"):
        found += [(index, 1) for index in (1, 2) if weight(index) is not None]
    return found


"""Per-token activation rounding for dynamic int8 ONNX files.

onnxruntime's dynamic int8 rounds a MatMul's whole input tensor with one run-time scale
(DynamicQuantizeLinear: asymmetric uint8, per tensor), so one outlier token sets the step of
every other token. all-MiniLM-L6-v2's feed-forward inputs lose most of its int8 fidelity
there (0.9929 mean cosine; with every input rounded per token 0.9974), the way LiteRT's
dynamic-range kernels do not (they scale each row: its .tflite scores 0.998).

A site here is one DynamicQuantizeLinear whose quantized output only MatMulIntegers read.
Rewritten, it scales each row (the last axis) by its own max |x| / 127 and rounds it
symmetrically into uint8 around a zero point of 128: MatMulInteger takes only a scalar A zero
point (a row's own zero point is refused: onnxruntime issue 27897), and the symmetric grid needs
none. onnxruntime fuses MatMulInteger -> Cast -> Mul(scale) into MatMulIntegerToFloat, which
reads its A scale as one number (a row scale there computed wrong outputs: cosine 0.70), so the
A scale stays the scalar 1 and the row scale multiplies the fused output after it.
"""
from __future__ import annotations

from collections.abc import Collection
from typing import Any

import numpy as np

ZERO_POINT = 128          # uint8 midpoint: symmetric rows, one zero point for every row
LEVELS = 127.0            # |q - 128| <= 127: the grid is symmetric
ZERO_POINT_NAME = "per_token_zero_point"   # the A zero point of every MatMulInteger rewritten
_CONSTANTS = {ZERO_POINT_NAME: np.array(ZERO_POINT, np.uint8),
              "per_token_levels": np.array(LEVELS, np.float32),
              "per_token_offset": np.array(float(ZERO_POINT), np.float32),
              "per_token_smallest": np.array(1e-30, np.float32),  # an all-zero row: scale > 0
              "per_token_unit_scale": np.array(1.0, np.float32),
              "per_token_last_axis": np.array([-1], np.int64)}


def sites(proto: Any) -> dict[str, int]:
    """{activation tensor: its width K} of every DynamicQuantizeLinear that per-token rounding
    can take: its quantized output read by MatMulIntegers only (B a 2-D weight), each followed
    by the Cast -> Mul onnxruntime's quantizer writes, its scale read by scale Muls only."""
    graph = proto.graph
    readers = _readers(graph)
    dims = {init.name: tuple(init.dims) for init in graph.initializer}
    found = {}
    for node in graph.node:
        chains = _chains(node, readers) if node.op_type == "DynamicQuantizeLinear" else None
        shapes = [dims.get(matmul.input[1], ()) for matmul, _ in chains or ()]
        if shapes and all(len(shape) == 2 for shape in shapes):
            found[node.input[0]] = shapes[0][0]
    return found


def round_per_token(proto: Any, tensors: Collection[str]) -> int:
    """Rewrites, in `proto`, the sites (`sites`) whose activation tensor is in `tensors` to
    per-token rounding; returns how many it rewrote."""
    from onnx import TensorProto, helper, numpy_helper

    graph = proto.graph
    readers = _readers(graph)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 13)
    after: dict[str, Any] = {}    # a scale Mul's name -> the row-scale Mul that follows it
    nodes, rewritten = [], 0
    for node in graph.node:
        chains = _chains(node, readers) if node.op_type == "DynamicQuantizeLinear" and \
            node.input[0] in tensors else None
        if not chains:
            nodes.append(node)
            if node.name in after:
                nodes.append(after.pop(node.name))
            continue
        rewritten += 1
        x, (quantized, scale, zero_point) = node.input[0], node.output

        def name(part: str, prefix: str = node.name or x) -> str:
            return f"{prefix}/per_token_{part}"

        row_max = (helper.make_node("ReduceMax", [name("abs"), "per_token_last_axis"],
                                    [name("max")], keepdims=1, name=name("max"))
                   if opset >= 18 else
                   helper.make_node("ReduceMax", [name("abs")], [name("max")], axes=[-1],
                                    keepdims=1, name=name("max")))
        nodes += [helper.make_node("Abs", [x], [name("abs")], name=name("abs")), row_max,
                  helper.make_node("Max", [name("max"), "per_token_smallest"],
                                   [name("max_positive")], name=name("max_positive")),
                  helper.make_node("Div", [name("max_positive"), "per_token_levels"],
                                   [name("scale")], name=name("scale")),
                  helper.make_node("Div", [x, name("scale")], [name("scaled")],
                                   name=name("scaled")),
                  helper.make_node("Round", [name("scaled")], [name("rounded")],
                                   name=name("rounded")),
                  helper.make_node("Add", [name("rounded"), "per_token_offset"],
                                   [name("shifted")], name=name("shifted")),
                  helper.make_node("Cast", [name("shifted")], [quantized],
                                   to=TensorProto.UINT8, name=name("uint8"))]
        for reader in readers.get(scale, []):
            _replace_input(reader, scale, "per_token_unit_scale")
        for matmul, scale_mul in chains:
            _replace_input(matmul, zero_point, ZERO_POINT_NAME)
            output = scale_mul.output[0]
            scale_mul.output[0] = f"{output}/per_tensor"
            after[scale_mul.name] = helper.make_node(
                "Mul", [scale_mul.output[0], name("scale")], [output],
                name=name("row_scale", scale_mul.name))
    if rewritten:
        present = {init.name for init in graph.initializer}
        unused = set() if opset >= 18 else {"per_token_last_axis"}   # axes: an attribute
        graph.initializer.extend(numpy_helper.from_array(value, key) for key, value in
                                 _CONSTANTS.items() if key not in present | unused)
        del graph.node[:]
        graph.node.extend(nodes)
    return rewritten


def _readers(graph: Any) -> dict[str, list[Any]]:
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        for tensor in node.input:
            readers.setdefault(tensor, []).append(node)
    return readers


def _chains(node: Any, readers: dict[str, list[Any]]) -> list[tuple[Any, Any]] | None:
    """[(MatMulInteger, the Mul applying its scales)] of a DynamicQuantizeLinear, or None
    when anything else reads its outputs or a chain is not Cast -> Mul (named nodes only:
    the rewrite places the row-scale Mul by name)."""
    quantized, scale, zero_point = node.output
    chains = []
    for matmul in readers.get(quantized, []):
        casts = readers.get(matmul.output[0], []) if matmul.op_type == "MatMulInteger" else []
        muls = readers.get(casts[0].output[0], []) if len(casts) == 1 and \
            casts[0].op_type == "Cast" else []
        if len(muls) != 1 or muls[0].op_type != "Mul" or not muls[0].name or \
                matmul.input[0] != quantized:
            return None
        chains.append((matmul, muls[0]))
    scale_readers = readers.get(scale, [])
    if not chains or any(r.op_type != "Mul" for r in scale_readers) or \
            any(r.op_type != "MatMulInteger" for r in readers.get(zero_point, [])):
        return None
    return chains


def _replace_input(node: Any, old: str, new: str) -> None:
    for index, tensor in enumerate(node.input):
        if tensor == old:
            node.input[index] = new

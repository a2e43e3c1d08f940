"""Multiply-accumulates of one sample: one rule per op type, for every artifact format.

What counts: every op that multiplies its input by a stored weight (a constant tensor,
possibly behind dequantize / cast / layout ops), whatever its number format: float,
float16, int8 (QDQ, QOperator, dynamic: MatMulInteger behind DynamicQuantizeLinear), int4,
onnxruntime's fused and quantized com.microsoft ops. An op counts

    positions x weight elements

where `positions` is the elements of the op's output (a transposed conv: its data input)
divided by its size on the axis the weight spans: a dense layer uses every weight once per
row, a conv once per output pixel (depthwise and grouped convs too, as their weights hold
only the channels they read), a transposed conv once per input pixel. A stack of weight
matrices (a batched MatMul's constant of rank 3+) uses each matrix on its own slice only.
The packed B of MatMulNBits / MatMulBnb4 counts as the K x N it encodes (the caller passes
that shape); an Einsum with a weight operand counts the product of all its index sizes.

Not counted: products of two activations (attention scores and the attention-weighted sum,
MatMul / BATCH_MATMUL without a constant operand, MultiHeadAttention / GroupQueryAttention,
which take projected inputs), elementwise ops, normalizations. At sequence length T a
transformer layer of width H adds 2 x T^2 x H of those, not in the figure: the count is the
work against weights, what pruning and quantization change, and it equals what the
channel-pruning report counts on the source model (backends/*/channels.py).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

Op = tuple[str, Sequence, Sequence]   # (op_type, input tensor ids, output tensor ids)


@dataclass(frozen=True)
class MacRule:
    """`weights`: the input indices that may hold the weight -> the axis of the positions
    tensor that weight spans (its output channels); the first constant one counts.
    `data`: None for positions taken from the output, else the input index they come from."""
    weights: Mapping[int, int] = field(default_factory=dict)
    data: int | None = None
    batched: bool = False    # a weight of rank > 2 is a stack of matrices, one per batch slice
    einsum: bool = False


_DENSE = MacRule({0: -2, 1: -1}, batched=True)    # A x B: a constant A spans the output's rows
_NCHW_CONV = MacRule({1: 1})
_NHWC_CONV = MacRule({1: -1})
_DENSE_B = MacRule({1: -1})                       # weight only at B (x W, a packed W, QKV W)

# op type -> rule; ONNX op types are CamelCase, TFLite's upper case, so one table holds both.
MAC_RULES: dict[str, MacRule] = {
    # ONNX standard ops
    "MatMul": _DENSE, "Gemm": _DENSE, "MatMulInteger": _DENSE,
    "QLinearMatMul": MacRule({0: -2, 3: -1}, batched=True),
    "Conv": _NCHW_CONV, "ConvInteger": _NCHW_CONV, "QLinearConv": MacRule({3: 1}),
    "ConvTranspose": MacRule({1: 1}, data=0),
    "Einsum": MacRule(einsum=True),
    # onnxruntime com.microsoft ops: fused / quantized forms of the above, as quantize_dynamic,
    # the transformers optimizer and a saved optimized session write them
    "FusedMatMul": _DENSE, "FusedGemm": _DENSE, "MatMulIntegerToFloat": _DENSE,
    "DynamicQuantizeMatMul": _DENSE_B, "QGemm": MacRule({0: -2, 3: -1}),
    "MatMulNBits": _DENSE_B, "MatMulBnb4": _DENSE_B, "GemmFastGelu": _DENSE_B,
    "FusedConv": _NCHW_CONV, "NhwcConv": _NHWC_CONV, "NhwcFusedConv": _NHWC_CONV,
    "Attention": _DENSE_B, "QAttention": _DENSE_B,   # the fused Q, K, V projection (H x 3H)
    # TFLite builtins (float, int8, int4 and hybrid kernels alike)
    "FULLY_CONNECTED": _DENSE_B, "BATCH_MATMUL": _DENSE,
    "CONV_2D": _NHWC_CONV, "DEPTHWISE_CONV_2D": _NHWC_CONV, "CONV_3D": _NHWC_CONV,
    "TRANSPOSE_CONV": MacRule({1: -1}, data=2), "CONV_3D_TRANSPOSE": MacRule({1: -1}, data=2),
}


def kernel_macs(ops: Sequence[Op], weight_shapes: Mapping, shapes: Mapping | None,
                passthrough: Mapping[str, int], equations: Mapping | None = None) -> int:
    """Multiply-accumulates of one sample through every op of MAC_RULES that reads a weight.

    `weight_shapes` maps constant ids to their (logical) shapes, `shapes` other tensors to
    their batch-1 shapes (None: one position per op, as for one token of a decoder),
    `passthrough` the op types a weight may reach its op through to the input index to follow
    back, `equations` an Einsum's first output to its equation. An op whose positions tensor
    has an unknown shape (a dim < 1) counts 0.
    """
    producer = {out: op for op in ops for out in op[2]}
    total = 0
    for op in ops:
        rule = MAC_RULES.get(op[0])
        if rule is None:
            continue
        if rule.einsum:
            total += _einsum_macs(op, weight_shapes, shapes or {}, producer, passthrough,
                                  (equations or {}).get(op[2][0] if op[2] else None))
            continue
        for index, axis in rule.weights.items():
            weight = _weight_at(op, index, weight_shapes, producer, passthrough)
            if weight is not None:   # an op of two constants counts once
                total += _rule_macs(op, rule, axis, [int(d) for d in weight_shapes[weight]], shapes)
                break
    return total


def _rule_macs(op: Op, rule: MacRule, axis: int, weight: list[int], shapes: Mapping | None) -> int:
    elements = int(np.prod(weight, dtype=np.int64))
    if rule.batched and len(weight) > 2:
        elements //= max(int(np.prod(weight[:-2], dtype=np.int64)), 1)
    if shapes is None:
        return elements
    ids = op[2] if rule.data is None else op[1][rule.data:]
    shape = shapes.get(ids[0]) if ids else None
    if not shape or any(int(d) < 1 for d in shape) or not -len(shape) <= axis < len(shape):
        return 0
    dims = [int(d) for d in shape]
    return int(np.prod(dims, dtype=np.int64)) // dims[axis] * elements


def _weight_at(op: Op, index: int, weights: Mapping, producer: Mapping,
               passthrough: Mapping[str, int]):
    """The constant at input `index`, followed back through passthrough ops; None if none."""
    if index >= len(op[1]):
        return None
    tensor = op[1][index]
    for _ in range(8):
        if tensor in weights or tensor not in producer:
            break
        src_type, src_inputs, _ = producer[tensor]
        if src_type not in passthrough or passthrough[src_type] >= len(src_inputs):
            break
        tensor = src_inputs[passthrough[src_type]]
    return tensor if tensor in weights else None


def _einsum_macs(op: Op, weights: Mapping, shapes: Mapping, producer: Mapping,
                 passthrough: Mapping[str, int], equation: str | None) -> int:
    """An Einsum of two operands, one of them a weight: the product of every index's size
    (each output element sums over the contracted indices), 0 where a shape is unknown."""
    if not equation or len(op[1]) != 2:
        return 0
    found = [_weight_at(op, i, weights, producer, passthrough) for i in (0, 1)]
    if found == [None, None]:
        return 0
    operands = [weights[w] if w is not None else shapes.get(t) for w, t in zip(found, op[1])]
    terms = equation.replace(" ", "").split("->")[0].split(",")
    if len(terms) != 2 or any(s is None or any(int(d) < 1 for d in s) for s in operands):
        return 0
    sizes: dict[str, int] = {}
    for term, shape in zip(terms, operands):
        labels = _labels(term, len(shape))
        if labels is None:
            return 0
        for label, dim in zip(labels, shape):
            sizes[label] = max(sizes.get(label, 1), int(dim))   # broadcast: the larger size
    return int(np.prod(list(sizes.values()), dtype=np.int64))


def _labels(term: str, rank: int) -> list[str] | None:
    """One label per dim of an operand; an ellipsis's dims get labels aligned from the right
    (".0" for the last of them), so broadcast dims of both operands share a label."""
    if "..." not in term:
        return list(term) if len(term) == rank else None
    head, tail = term.split("...")
    free = rank - len(head) - len(tail)
    if free < 0:
        return None
    return [*head, *(f".{free - 1 - i}" for i in range(free)), *tail]

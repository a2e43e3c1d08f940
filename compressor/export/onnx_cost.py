"""A deterministic latency model of dynamic int8 ONNX candidates (onnx_candidates.py), read
from the graph alone, so that which candidate may win, and what the mixed one holds, is the
same on every run: measured p50s vary run to run (a candidate near the bound was in on one
run and out on the next, and the same seed gave different bytes).

A candidate's cost is its quantized weight MatMuls' multiplies (K x N weight elements: the
token count is the same for every candidate of one model) times their kernel's cost per
multiply: MatMulInteger (dynamic int8, with its run-time activation quantization) 1.0,
MatMulNBits (8-bit, accuracy_level 4: onnx_blockwise.py) NBITS_COST; plus, for each input
rounded per token (onnx_per_token.py), its elementwise ops in the same unit. Every other op is the
same in every candidate (smoothing's few Muls are not counted) and is modelled as REST_SHARE
of the plain dynamic file's time, so a candidate's cost over the plain file's is
REST_SHARE + (1 - REST_SHARE) x its matmul cost / the plain file's matmul cost.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

INTEGER_COST = 1.0
# MatMulNBits 8-bit accuracy_level 4 (blocks of 128) per multiply over MatMulInteger + its
# DynamicQuantizeLinear (onnxruntime's quantize_dynamic, 8-bit, per tensor), bias Add alike.
# Measured 2026-12-04 with onnxruntime 1.32.0 on an Intel Xeon (avx2, avx512f, avx512_vnni,
# avx_vnni, avx512_bf16, amx_int8), 1 thread, batch 1 x 128 tokens, chains of 8 MatMuls
# (per-run overhead amortized), each file's quietest of 9 rounds of 30 runs, p50 ratios:
# 384x384 5.65, 384x1536 5.73, 768x768 6.17, 768x3072 6.46 (geometric mean 5.99; single
# matmuls: 5.0-7.1). With 2 threads 3.0-5.4; at 32 tokens 4.5-5.3. Per-channel or 7-bit
# weights time as the plain file (0.97-1.08): all MatMulInteger, INTEGER_COST.
NBITS_COST = 6.0
# The plain dynamic file's time outside its quantized weight matmuls (LayerNorms, GELU,
# attention's float MatMuls and softmax, reshapes): onnxruntime's profiler (1 thread, batch
# 1 x 32 tokens, same machine and date) put it at 0.57 (all-MiniLM-L6-v2), 0.63 (bert6x384)
# and 0.72 (encoder4x128) of the bench's int8 files; the lowest, rounded down, so the model
# overstates a blockwise matmul's share (a candidate's modelled ratio >= its measured one).
REST_SHARE = 0.5
# An input rounded per token (onnx_per_token.py) instead of by DynamicQuantizeLinear: seven
# elementwise ops over its T x K values and a Mul over each reader's output, whose time is
# mostly per-op overhead at encoder sizes. In multiplies of a MatMulInteger per token (32
# tokens, 1 thread, same machine): PER_TOKEN_FIXED + PER_TOKEN_PER_CHANNEL x K. Measured on
# chains of 8 K x K MatMuls: 7-8 us per input at K <= 128, 14 at 384, 23 at 768, 42 at 1536,
# against 0.17-0.22 ns per multiply of the plain file.
PER_TOKEN_FIXED = 25_000
PER_TOKEN_PER_CHANNEL = 120


def matmul_costs(path: Path) -> dict[str, float]:
    """{node name: multiplies x kernel cost} of the file's quantized weight MatMuls:
    MatMulInteger with an initializer B (K x N) and MatMulNBits (its K, N attributes); and
    {"<input> per token": its cost} of each input rounded per token (onnx_per_token.py)."""
    import onnx

    from compressor.export.onnx_per_token import ZERO_POINT_NAME

    graph = onnx.load(str(path), load_external_data=False).graph
    dims = {init.name: tuple(init.dims) for init in graph.initializer}
    costs = {}
    for index, node in enumerate(graph.node):
        name = node.name or f"{node.op_type}_{index}"
        if node.op_type == "MatMulInteger" and len(dims.get(node.input[1], ())) >= 2:
            k, n = dims[node.input[1]][-2:]
            costs[name] = float(k * n) * INTEGER_COST
            if len(node.input) > 2 and node.input[2] == ZERO_POINT_NAME:
                costs[f"{node.input[0]} per token"] = _per_token_cost(k)
        elif node.op_type == "MatMulNBits":
            attrs = {attr.name: attr.i for attr in node.attribute}
            costs[name] = float(attrs["K"] * attrs["N"]) * NBITS_COST
    return costs


def matmul_cost(path: Path) -> float:
    """The file's quantized weight matmuls' total cost (matmul_costs)."""
    return sum(matmul_costs(path).values())


def vs_plain(cost: float, plain_cost: float) -> float:
    """A candidate's modelled latency over the plain dynamic file's, from both matmul costs."""
    if plain_cost <= 0:
        return 1.0 if cost <= 0 else round(1.0 + cost, 4)   # nothing quantized to compare
    return round(REST_SHARE + (1.0 - REST_SHARE) * cost / plain_cost, 4)


def blockwise_costs(shapes: dict[str, tuple[int, int]], plain_cost: float) -> dict[str, float]:
    """{node: what making it MatMulNBits instead of MatMulInteger adds, over the plain file's
    modelled latency}: the mixed candidate's per-matmul costs (sum + its base's = its own)."""
    extra = (1.0 - REST_SHARE) * (NBITS_COST - INTEGER_COST) / max(plain_cost, 1.0)
    return {node: round(extra * k * n, 5) for node, (k, n) in shapes.items()}


def per_token_costs(sites: dict[str, int], plain_cost: float) -> dict[str, float]:
    """{input tensor: what rounding it per token adds over the plain file's modelled latency}
    for sites {tensor: its width K} (onnx_per_token.sites)."""
    share = (1.0 - REST_SHARE) / max(plain_cost, 1.0)
    return {tensor: round(share * _per_token_cost(width), 5) for tensor, width in sites.items()}


def _per_token_cost(width: int) -> float:
    return float(PER_TOKEN_FIXED + PER_TOKEN_PER_CHANNEL * width)


def describe() -> dict[str, Any]:
    """The model's constants and rule, for report.json."""
    return {"rule": "REST_SHARE + (1 - REST_SHARE) x sum(K x N x kernel cost) over the plain "
                    "dynamic file's (quantized weight MatMuls)", "REST_SHARE": REST_SHARE,
            "kernel_cost": {"MatMulInteger": INTEGER_COST, "MatMulNBits": NBITS_COST},
            "per_token_input_cost": f"{PER_TOKEN_FIXED} + {PER_TOKEN_PER_CHANNEL} x K"}

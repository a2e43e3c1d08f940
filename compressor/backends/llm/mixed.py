"""Mixed bit widths for an int4 recipe: the matrices whose int4 rounding costs most are kept at
int8, within a byte budget (the recipe's `int8_budget` x the all-int4 bytes).

Why: on a small model the tied embedding / lm_head is a fifth of the weights and its int4
rounding alone moves perplexity by several percent (a real 135M Llama: ours all-int4 +21.5%,
llama.cpp's Q4_0 with its head at Q8_0 +20.5%); llama.cpp keeps it at 8 bits for that reason.
Which matrices cost most depends on the model, so it is measured: each matrix's output error
(grid.output_error, on the calibration windows' inputs) ranks them, in two orders (the error
itself, and the error per extra byte); candidates.py keeps whichever order, or none, brings the
model closest to the float one.

Matrices change width in units the exporters can store: a layer's q / k / v together and its
gate / up together (onnxruntime-genai's builder packs those into one MatMulNBits), any other
matrix on its own. A stack of experts stays int4. The int8 grid is symmetric with one scale per
row (grid.int8_rows), which MatMulNBits and LiteRT's int8 kernels both store exactly.

Bytes are counted as the ONNX file stores them (float32 scales; symmetric, so no zero points):
int4 groups of g cost K/2 + 4K/g bytes a row, int8 K + 4K/g8.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from compressor.backends.llm.model import QuantizedLinear
from compressor.decoders.storage import fitted_group

INT8_GROUP = 128    # the int8 blocks' largest size (the scale repeats: one per row in effect)
# the costliest first by: output error; output error per extra byte; the token table (tied
# embedding / lm_head, llama.cpp's choice) first, then output error
ORDERS = ("error", "error_per_byte", "table_first")
_PACKED_TOGETHER = ((re.compile(r"\.(q|k|v)_proj\.weight$"), ".qkv"),
                    (re.compile(r"\.(gate|up)_proj\.weight$"), ".gate_up"))


@dataclass(frozen=True)
class Unit:
    """Matrices that change width together: their summed output error, and the bytes int8
    costs over int4."""

    name: str
    params: tuple[str, ...]
    error: float
    extra_bytes: int


def onnx_bytes(weight: QuantizedLinear) -> int:
    """Bytes of one quantized weight as MatMulNBits stores it (float32 scales, symmetric)."""
    *lead, n, k = weight.shape
    count = 1
    for size in lead:
        count *= size
    return count * n * (k * weight.bits // 8 + 4 * (k // weight.group_size))


def int8_bytes(n: int, k: int) -> int | None:
    group = fitted_group(INT8_GROUP, [k])
    return None if group is None else n * (k + 4 * (k // group))


def units(weights: dict[str, QuantizedLinear], errors: dict[str, float]) -> list[Unit]:
    """The units int8 can be bought for: every measured 2-D int4 matrix, grouped as the
    exporters pack them (a unit any of whose matrices has no int8 block size is left out)."""
    grouped: dict[str, list[str]] = {}
    for name in errors:
        if weights[name].bits == 4 and weights[name].experts is None:
            grouped.setdefault(_unit_name(name), []).append(name)
    found = []
    for name, params in grouped.items():
        extra = [int8_bytes(*weights[p].shape) for p in params]
        if None in extra:
            continue
        found.append(Unit(name, tuple(params), sum(errors[p] for p in params),
                          sum(extra) - sum(onnx_bytes(weights[p]) for p in params)))
    return found


def _unit_name(param: str) -> str:
    for pattern, joined in _PACKED_TOGETHER:
        if pattern.search(param):
            return pattern.sub(joined, param)
    return param.removesuffix(".weight")


def chosen(candidates: Iterable[Unit], spare_bytes: float, order: str,
           tables: frozenset[str] = frozenset()) -> list[Unit]:
    """Units in `order` (ORDERS: the costliest first), each taken while the bytes it adds fit;
    `tables`: the token tables' parameter names (the embedding, the lm_head)."""
    def rank(unit: Unit) -> tuple[bool, float]:
        first = order == "table_first" and bool(tables & set(unit.params))
        return first, unit.error / max(unit.extra_bytes, 1) if order == "error_per_byte" \
            else unit.error

    taken = []
    for unit in sorted(candidates, key=rank, reverse=True):
        if unit.extra_bytes <= spare_bytes and unit.error > 0:
            taken.append(unit)
            spare_bytes -= unit.extra_bytes
    return taken


def with_int8(weights: dict[str, QuantizedLinear], names: Iterable[str], floats: dict[str, Any]
              ) -> dict[str, QuantizedLinear]:
    """`weights` with the matrices `names` at int8 (`floats`: parameter name -> the float
    weight [N, K], the model's own)."""
    from compressor.backends.llm.grid import int8_rows

    upgraded = dict(weights)
    for name in names:
        weight = floats[name]
        made = int8_rows(weight, fitted_group(INT8_GROUP, [weight.shape[1]]))
        upgraded[name] = QuantizedLinear.from_packed(
            made.packed, made.scales, made.zeros, 8, made.group_size,
            transposed=weights[name].transposed)
    return upgraded


def int8_blocks_for(weights: dict[str, QuantizedLinear], floats: dict[str, Any], block: int
                    ) -> dict[str, QuantizedLinear]:
    """An int8 model's integers on a symmetric scale per `block` inputs (a format's own int8
    grid: GGUF's Q8_0 at 32), where the widths allow it; other matrices as they are."""
    from compressor.backends.llm.grid import int8_blocks

    made = dict(weights)
    for name, weight in weights.items():
        if weight.experts is None and weight.shape[1] % block == 0:
            blocks = int8_blocks(floats[name], block)
            made[name] = QuantizedLinear.from_packed(blocks.packed, blocks.scales, blocks.zeros,
                                                     8, block, transposed=weight.transposed)
    return made


def spare_bytes(weights: dict[str, QuantizedLinear], budget: float) -> float:
    """The bytes int8 may add: (budget - 1) x the int4 bytes of the matrices it may be bought
    for (stacks of experts stay int4 and do not count), the ceiling the planner counts
    (decoders/footprint.py)."""
    return (budget - 1.0) * sum(onnx_bytes(w) for w in weights.values()
                                if w.bits == 4 and w.experts is None)


def int8_rows_for(weights: dict[str, QuantizedLinear], floats: dict[str, Any]
                  ) -> dict[str, QuantizedLinear]:
    """An int8 model's integers put on one symmetric scale per row (stacks of experts kept):
    the grid a .tflite stores exactly, where per-group zero points are rounded again."""
    return with_int8(weights, [name for name, w in weights.items()
                               if w.experts is None and int8_bytes(*w.shape) is not None], floats)

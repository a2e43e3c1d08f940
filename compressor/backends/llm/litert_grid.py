"""compressor's integers (QuantizedLinear: w = (q - zero) * scale per group) on the grids
LiteRT's kernels compute with: symmetric (zero point 0), int8 per output channel, int4 per
channel (float32 scales, used as stored) or per block of 32 / 64 / 128 / 256 inputs with a
float16 scale tensor, which XNNPACK's FULLY_CONNECTED converts to bfloat16 (measured on
ai-edge-litert 2.3: it computes with bf16(fp16(scale)); EMBEDDING_LOOKUP uses the fp16 value).

A weight on one of those grids keeps its integers (q - 2**(bits-1)) and scales: "exact", or
"scales_rounded" where its block scales are not bfloat16 numbers (quantizers that round each
block's scale to bfloat16 before rounding the weights, as ai-edge-quantizer does, avoid it).
Any other grid (asymmetric zero points, int8 per group) cannot be written as it is: it is
"rounded_again" to nearest from its dequantized values onto LiteRT's grid (scale = absmax /
127 or / 7, what litert's own quantizer does).
"""
from __future__ import annotations

import numpy as np

from compressor.backends.llm.litert_weights import (BLOCK_SCALE_FLOOR, BLOCKS,
                                                  CHANNEL_SCALE_FLOOR, LiteRtWeight)
from compressor.backends.llm.model import QuantizedLinear
from compressor.decoders.footprint_tflite import litert_block


EXACT, SCALES_ROUNDED, ROUNDED_AGAIN = "exact", "scales_rounded", "rounded_again"


def kernel_scales(scales: np.ndarray) -> np.ndarray:
    """Block scales as XNNPACK computes with them: float16, then bfloat16."""
    import torch

    return torch.from_numpy(scales.astype(np.float16).astype(np.float32)).to(
        torch.bfloat16).to(torch.float32).numpy()


def on_litert_grid(weight: QuantizedLinear) -> tuple[LiteRtWeight, str]:
    """(the weight as LiteRT stores it, EXACT / SCALES_ROUNDED / ROUNDED_AGAIN)."""
    bits, group = weight.bits, weight.group_size
    q = weight.q.numpy().astype(np.int16)
    n, k = q.shape
    half = 2 ** (bits - 1)
    scales = weight.scales.numpy().astype(np.float32)
    if bool((weight.zeros.numpy() == half).all()):
        values = (q - half).astype(np.int8)
        if bits == 4 and (group in BLOCKS or group == k):
            used = usable_scales(values, scales, group)
            kept = group == k or bool((kernel_scales(used) == used).all())
            return LiteRtWeight(values, used, 4, group), \
                EXACT if kept and _same_weights(values, scales, used, group) else SCALES_ROUNDED
        if bits == 8 and (group == k or bool((scales == scales[:, :1]).all())):
            used = usable_scales(values, scales[:, :1], k)
            return LiteRtWeight(values, used, 8, k), \
                EXACT if _same_weights(values, scales[:, :1], used, k) else SCALES_ROUNDED
    values = weight.dequantize().numpy()
    if bits == 8:
        return round_to_nearest(values, 8, k), ROUNDED_AGAIN
    block = litert_block(group, (k,)) or k     # the block the planner counts (footprint_tflite)
    return round_to_nearest(values, 4, block), ROUNDED_AGAIN


def usable_scales(values: np.ndarray, scales: np.ndarray, block: int) -> np.ndarray:
    """`scales` raised to the floor XNNPACK accepts where they fall below it."""
    floor = CHANNEL_SCALE_FLOOR if block == values.shape[1] else BLOCK_SCALE_FLOOR
    return np.maximum(scales, floor).astype(np.float32)


def _same_weights(values: np.ndarray, scales: np.ndarray, used: np.ndarray, block: int) -> bool:
    """Whether raising scales to the floor left every weight as it was (only all-zero blocks
    were raised)."""
    raised = used != scales
    if not raised.any():
        return True
    n, k = values.shape
    blocks = np.abs(values.reshape(n, k // block, block)).max(axis=-1)
    return bool((blocks[raised] == 0).all())


def round_to_nearest(values: np.ndarray, bits: int, block: int) -> LiteRtWeight:
    """Symmetric round to nearest per block (block == K: per channel), scale = absmax /
    (2**(bits-1) - 1); block scales are first put on the kernel's bfloat16 grid, so the
    integers are made with the scale the kernel uses."""
    n, k = values.shape
    top = 2 ** (bits - 1) - 1
    groups = values.reshape(n, k // block, block).astype(np.float32)
    scales = np.maximum(np.abs(groups).max(axis=-1) / top, CHANNEL_SCALE_FLOOR)
    if block != k:
        scales = np.maximum(kernel_scales(scales), BLOCK_SCALE_FLOOR)
    q = np.clip(np.rint(groups / scales[..., None]), -top - 1 if bits == 4 else -top, top)
    return LiteRtWeight(q.reshape(n, k).astype(np.int8), scales.astype(np.float32), bits, block)


def as_computed(weight: QuantizedLinear) -> QuantizedLinear:
    """`weight` as a .tflite computes with it (on_litert_grid, and block scales as the kernel
    reads them): itself where it is stored exactly; stacked experts as they are."""
    import torch

    if weight.experts is not None:
        return weight
    stored, status = on_litert_grid(weight)
    if status == EXACT:
        return weight
    half = 2 ** (stored.bits - 1)
    blockwise = stored.bits == 4 and stored.block != stored.values.shape[1]
    scales = kernel_scales(stored.scales) if blockwise else stored.scales
    q = torch.from_numpy((stored.values.astype(np.int16) + half).astype(np.uint8))
    zeros = torch.full(tuple(scales.shape), half, dtype=torch.uint8)
    made = QuantizedLinear(q, torch.from_numpy(scales.astype(np.float32)), zeros, stored.bits,
                           stored.block)
    return QuantizedLinear.from_packed(made.packed, made.scales, made.zeros, made.bits,
                                       made.group_size, transposed=weight.transposed)

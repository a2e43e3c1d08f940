"""Our integers as llama.cpp's blocks (the GGUF route), without rounding them again where the
grid is llama.cpp's own.

llama.cpp's blocks hold 32 consecutive inputs of one output row with a float16 scale d:
- Q4_0 (18 bytes): w = d * (q - 8), q in 0..15: our symmetric int4 grid (zero point 8) with any
  group that is a multiple of 32 (a group of 128 is four blocks repeating its scale).
- Q4_1 (20 bytes): w = d * q + m: an asymmetric int4 grid, m = -d * zero in float16.
- Q8_0 (34 bytes): w = d * q, q int8: our symmetric int8 grid (zero point 128), e.g. the rows an
  int4 recipe keeps at 8 bits (grid.int8_rows, whose scales are float16-exact).
Any other grid (int8 with zero points, groups that are not multiples of 32) is rounded again
from the weights it computes, by the `gguf` package's port of llama.cpp's own quantizers (Q8_0
for 8 bits, Q4_0 for 4), and says so (`Blocks.exact`).

Scales: ours are float32 (bfloat16-exact for symmetric int4: grid.py). A scale float16 holds
exactly is written as it is. One it cannot hold exactly but within float16's normal range is
rounded to the nearest float16 (relative change <= 2**-11; the integers stay). A scale below
float16's smallest normal (6.1e-5: a group whose weights are all below ~4e-4) or above its
largest would lose digits or overflow, so such a tensor is written F16 (its weights as computed,
each rounded to float16) and says so; a block whose weights are all zero (a padding token's
row) is not counted: it is stored with scale 0, exactly.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compressor.backends.llm.model import QuantizedLinear

BLOCK = 32
F32, F16, Q4_0, Q4_1, Q8_0, BF16 = 0, 1, 2, 3, 8, 30      # ggml type ids
TYPE_NAMES = {F32: "F32", F16: "F16", Q4_0: "Q4_0", Q4_1: "Q4_1", Q8_0: "Q8_0", BF16: "BF16"}
HALF_NORMAL_MIN = float(np.finfo(np.float16).tiny)         # 2**-14
HALF_MAX = float(np.finfo(np.float16).max)


@dataclass(frozen=True)
class Blocks:
    """One tensor as GGUF stores it: ggml type, its bytes [(E,) N, K / 32 * block bytes] (float
    types: the values themselves), and how they relate to our integers."""

    ggml_type: int
    data: np.ndarray
    exact: bool          # the file computes exactly our weights
    how: str             # "kept" | "scales rounded to float16" | "rounded again" | "F16: ..."


def as_blocks(weight: QuantizedLinear) -> Blocks:
    """`weight` (one matrix or stacked experts) in llama.cpp's blocks, see the module docs."""
    if weight.experts is not None:
        parts = [as_blocks(m) for m in weight.matrices()]
        first = parts[0]
        return Blocks(first.ggml_type, np.stack([p.data for p in parts]),
                      all(p.exact for p in parts), first.how)
    n, k = weight.shape
    if k % BLOCK:
        return _f16(weight, f"{k} inputs is not a multiple of {BLOCK}")
    zeros = weight.zeros.numpy()
    half = 2 ** (weight.bits - 1)
    if weight.group_size % BLOCK == 0 and (weight.bits == 4 or (zeros == half).all()):
        repeat = weight.group_size // BLOCK
        codes = weight.q.numpy().reshape(n, k // BLOCK, BLOCK)
        zero = np.repeat(zeros, repeat, axis=1)
        # a block of zero weights (a padding token's row) holds anything with scale 0
        empty = (codes == zero[..., None]).all(axis=-1)
        d = np.where(empty, 0.0, np.repeat(weight.scales.numpy().astype(np.float32), repeat, axis=1))
        used = d[~empty]
        if used.size and (used.min() < HALF_NORMAL_MIN or used.max() > HALF_MAX):
            return _f16(weight, "a scale outside float16's normal range")
        rounded = d.astype(np.float16)
        how = "kept" if (rounded.astype(np.float32) == d).all() else "scales rounded to float16"
        if weight.bits == 8:
            return Blocks(Q8_0, _q8_0(rounded, codes), how == "kept", how)
        if (zeros == half).all():
            return Blocks(Q4_0, _q4(rounded, None, codes), how == "kept", how)
        m = -(d * zero)
        exact = how == "kept" and (m.astype(np.float16).astype(np.float32) == m).all()
        return Blocks(Q4_1, _q4(rounded, m.astype(np.float16), codes), bool(exact),
                      "kept" if exact else "scales rounded to float16")
    import gguf

    qtype = Q8_0 if weight.bits == 8 else Q4_0
    data = gguf.quants.quantize(weight.dequantize().numpy().astype(np.float32),
                                gguf.GGMLQuantizationType(qtype))
    return Blocks(qtype, data, False, "rounded again")


def _f16(weight: QuantizedLinear, why: str) -> Blocks:
    return Blocks(F16, weight.dequantize().numpy().astype(np.float16), False, f"F16: {why}")


def _q8_0(d: np.ndarray, codes: np.ndarray) -> np.ndarray:
    n, blocks, _ = codes.shape
    out = np.empty((n, blocks, 34), np.uint8)
    out[..., :2] = d.reshape(n, blocks, 1).view(np.uint8)
    out[..., 2:] = (codes.astype(np.int16) - 128).astype(np.int8).view(np.uint8)
    return out.reshape(n, blocks * 34)


def _q4(d: np.ndarray, m: np.ndarray | None, codes: np.ndarray) -> np.ndarray:
    """Q4_0 (m None) or Q4_1 blocks: d (, m), then inputs 0..15 in the low nibbles and 16..31 in
    the high ones."""
    n, blocks, _ = codes.shape
    head = 2 if m is None else 4
    out = np.empty((n, blocks, head + 16), np.uint8)
    out[..., :2] = d.reshape(n, blocks, 1).view(np.uint8)
    if m is not None:
        out[..., 2:4] = m.reshape(n, blocks, 1).view(np.uint8)
    out[..., head:] = (codes[..., :16] & 0xF) | ((codes[..., 16:] & 0xF) << 4)
    return out.reshape(n, blocks * (head + 16))


def as_computed(weight: QuantizedLinear) -> QuantizedLinear:
    """`weight` as llama.cpp computes with it (Format.lm_weights of the GGUF route): itself where
    the blocks keep it, the Q8_0 / Q4_0 grid it is rounded to otherwise (F16 tensors: itself,
    within float16 rounding)."""
    import torch

    if weight.experts is not None:
        return weight
    blocks = as_blocks(weight)
    if blocks.exact or blocks.ggml_type not in (Q8_0, Q4_0):
        return weight
    n, k = weight.shape
    size = 34 if blocks.ggml_type == Q8_0 else 18
    raw = blocks.data.reshape(n, k // BLOCK, size)
    d = np.ascontiguousarray(raw[..., :2]).view(np.float16)[..., 0].astype(np.float32)
    if blocks.ggml_type == Q8_0:
        codes = (raw[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        bits, zero = 8, 128
    else:
        nibbles = raw[..., 2:]
        codes = np.concatenate([nibbles & 0xF, nibbles >> 4], axis=-1)
        bits, zero = 4, 8
    made = QuantizedLinear(torch.from_numpy(codes.reshape(n, k)), torch.from_numpy(d),
                           torch.full(d.shape, zero, dtype=torch.uint8), bits, BLOCK)
    return QuantizedLinear.from_packed(made.packed, made.scales, made.zeros, bits, BLOCK,
                                       transposed=weight.transposed)

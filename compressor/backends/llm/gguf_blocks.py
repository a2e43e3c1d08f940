"""llama.cpp's 4-bit blocks (Q4_0, Q4_1) as QuantizedLinear, without rounding them again.

Both store 32 consecutive inputs of one output row per block, which is our group of 32:
- Q4_0, 18 bytes: fp16 scale d, then 16 bytes of nibbles (low nibbles are inputs 0..15, high
  nibbles 16..31); w = d * (q - 8). That is our grid exactly: scale d, zero point 8.
- Q4_1, 20 bytes: fp16 d, fp16 m, 16 bytes of nibbles; w = d * q + m. Our grid needs an
  integer zero point (onnxruntime's MatMulNBits stores uint8 zero points; float ones decode
  ~28x slower, measured with onnxruntime 1.32), and -m / d is not an integer in general. `q41_on_int_grid` keeps
  the codes, rounds the zero point and refits the group's scale by least squares: the
  weights move by at most d / 2 (rms) per group. Measured cost, and why load_gguf leaves
  Q4_1 to the recipe by default: gguf.py's module docstring.
"""
from __future__ import annotations

import numpy as np
import torch

from compressor.backends.llm.model import QuantizedLinear

BLOCK = 32
Q4_0, Q4_1 = 2, 3                 # ggml type ids
BLOCK_BYTES = {Q4_0: 18, Q4_1: 20}
MAXQ = 15
CHUNK_ROWS = 1024          # rows of a Q4_1 tensor widened to int16 at once


def unpack_blocks(raw: np.ndarray, ggml_type: int, order: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(codes uint8 [N, K], d float32 [N, K/32], m float32 [N, K/32] or None) of a tensor's
    raw bytes [N, K/32 * block bytes] as GGUFReader maps them, rows taken in `order`.
    Written into preallocated arrays: no float or full-size temporaries (a large model's
    tensors would otherwise leave the heap fragmented at several times the grids' size)."""
    if order is not None:
        raw = raw[order.numpy()]     # whole rows (blocks never span rows): a byte copy
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, BLOCK_BYTES[ggml_type])
    d = np.ascontiguousarray(blocks[..., 0:2]).view(np.float16)[..., 0].astype(np.float32)
    m = np.ascontiguousarray(blocks[..., 2:4]).view(np.float16)[..., 0].astype(np.float32) \
        if ggml_type == Q4_1 else None
    nibbles = blocks[..., 2 if ggml_type == Q4_0 else 4:]
    codes = np.empty((rows, blocks.shape[1], BLOCK), dtype=np.uint8)
    np.bitwise_and(nibbles, 0x0F, out=codes[..., :BLOCK // 2])
    np.right_shift(nibbles, 4, out=codes[..., BLOCK // 2:])
    return (torch.from_numpy(codes.reshape(rows, -1)), torch.from_numpy(d),
            None if m is None else torch.from_numpy(m))


def exact_weight(codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
    """The float32 weight llama.cpp (and transformers' dequantization) computes from the
    blocks, in the same operation order, so the values are bit-identical."""
    groups = codes.reshape(codes.shape[0], -1, BLOCK).to(torch.float32)
    if m is None:
        values = d[..., None] * (groups - 8)
    else:
        values = d[..., None] * groups + m[..., None]
    return values.reshape(codes.shape)


def matches(codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None,
            weight: torch.Tensor, samples: int = 16) -> bool:
    """Whether the blocks are `weight` (bit for bit in its dtype), checked on `samples` rows
    spread over the matrix: a wrong name or row order shows on nearly every row."""
    if tuple(codes.shape) != tuple(weight.shape):
        return False
    rows = torch.unique(torch.linspace(0, codes.shape[0] - 1, samples).round().long())
    exact = exact_weight(codes[rows], d[rows], None if m is None else m[rows])
    return torch.equal(exact.to(weight.dtype), weight.detach()[rows])


def q40_grid(codes: torch.Tensor, d: torch.Tensor) -> QuantizedLinear:
    return QuantizedLinear(q=codes, scales=d, zeros=torch.full(d.shape, 8, dtype=torch.uint8),
                           bits=4, group_size=BLOCK)


def q41_on_int_grid(codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> QuantizedLinear:
    """Q4_1 blocks on an integer-zero-point grid. Per group the codes are kept and the zero
    point is the better of floor / ceil of -m / d, each with its least-squares scale
    s = <q - z, w> / <q - z, q - z> (w = d q + m, the file's weights), so the error is at
    most that of rounding the zero point alone (|z - (-m / d)| * d <= d / 2 per weight).
    The sums need only sum(q) and sum(q^2) per group, in float64. A group whose zero point
    lies outside 0..15 (all its weights of one sign) or whose d is 0 is put on its own
    min-max grid (0 included) by round to nearest. `codes` becomes the grid's q (in place)."""
    n, k = codes.shape
    groups = codes.reshape(n, -1, BLOCK)
    sum_q = torch.empty(d.shape, dtype=torch.float64)
    sum_qq = torch.empty(d.shape, dtype=torch.float64)
    for start in range(0, n, CHUNK_ROWS):   # an int16 copy of a few rows at a time
        wide = groups[start:start + CHUNK_ROWS].to(torch.int16)
        sum_q[start:start + CHUNK_ROWS] = wide.sum(-1, dtype=torch.int32).double()
        sum_qq[start:start + CHUNK_ROWS] = (wide * wide).sum(-1, dtype=torch.int32).double()
    d64, m64 = d.double(), m.double()
    real_zero = -m64 / torch.where(d64 == 0, torch.ones_like(d64), d64)
    sum_ww = d64 * d64 * sum_qq + 2 * d64 * m64 * sum_q + BLOCK * m64 * m64
    best, scales, zeros = torch.full(d.shape, float("inf"), dtype=torch.float64), d64, None
    for zero in (torch.floor(real_zero).clamp(0, MAXQ), torch.ceil(real_zero).clamp(0, MAXQ)):
        sum_cc = sum_qq - 2 * zero * sum_q + BLOCK * zero * zero
        sum_cw = d64 * sum_qq + m64 * sum_q - zero * (d64 * sum_q + BLOCK * m64)
        scale = torch.where(sum_cc > 0, sum_cw / sum_cc.clamp(min=1e-30), d64)
        error = sum_ww - 2 * scale * sum_cw + scale * scale * sum_cc
        better = error < best
        best = torch.where(better, error, best)
        scales = torch.where(better, scale, scales)
        zeros = zero if zeros is None else torch.where(better, zero, zeros)
    scales, zeros = scales.to(torch.float32), zeros.to(torch.uint8)
    off_grid = (d == 0) | (real_zero < -0.5) | (real_zero > MAXQ + 0.5)
    if off_grid.any():
        rows, blocks = off_grid.nonzero(as_tuple=True)
        target = d[rows, blocks, None] * groups[rows, blocks].to(torch.float32) \
            + m[rows, blocks, None]
        low, high = target.amin(-1).clamp(max=0), target.amax(-1).clamp(min=0)
        scale = ((high - low) / MAXQ).clamp(min=1e-8)
        zero = torch.round(-low / scale).clamp(0, MAXQ)
        q = torch.clamp(torch.round(target / scale[:, None]) + zero[:, None], 0, MAXQ)
        groups[rows, blocks] = q.to(torch.uint8)
        scales[rows, blocks], zeros[rows, blocks] = scale, zero.to(torch.uint8)
    return QuantizedLinear(q=codes, scales=scales, zeros=zeros, bits=4, group_size=BLOCK)


def unpermute_rows(rows: int, heads: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's q/k permutation (convert_hf_to_gguf.py `permute`,
    which transformers reverses the same way when it dequantizes): stored[index] is the
    transformers row. Rows only, so whole blocks move and no value changes."""
    rows, heads = int(rows), int(heads)
    index = np.arange(rows).reshape(heads, rows // heads // 2, 2).swapaxes(2, 1).reshape(-1)
    return torch.from_numpy(np.ascontiguousarray(index))

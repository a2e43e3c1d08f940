"""Integer grids for weight-only quantization, and the two ways to put weights on them:
round to nearest (RTN) and GPTQ.

The grid is asymmetric per group of `group_size` input channels: a float scale and an integer
zero point each, w ~ (q - zero) * scale, q in 0 .. 2**bits - 1 (onnxruntime's MatMulNBits and
llama.cpp's Q4_1-style blocks store exactly this), or symmetric (zero point 2**(bits-1), scale
absmax / (2**(bits-1) - 1) rounded to bfloat16): LiteRT's int4 grid, which MatMulNBits stores
exactly too (the int4 recipe's default, handlers.weight_only_plan).

GPTQ (Frantar et al., 2022) quantizes one input column at a time and spreads each column's
rounding error over the columns not yet quantized, weighted by the inverse Hessian of the
layer's inputs (H = X^T X on calibration text), so the layer's outputs, not its weights, stay
close.
"""
from __future__ import annotations

import torch

from compressor.backends.llm.model import QuantizedLinear, pack_codes

GPTQ_DAMP = 0.01       # fraction of the mean Hessian diagonal added before inverting
GPTQ_BLOCK = 128       # columns updated together (lazy batch updates)
RTN_ROWS = 1024        # output rows rounded at once
CLIP_STEPS, CLIP_MIN = 11, 0.75   # candidate ranges per group: 100%, 97.5%, ... 75% of it


def grid_params(w: torch.Tensor, bits: int, symmetric: bool = False,
                importance: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, zero) per row of `w` [N, g] (0 always representable): of the group's range
    shrunk by 0 to 25% (CLIP_STEPS candidates), the one with the smallest rounding error,
    weighted per column by `importance` ([g], or [N, g] a row each: the Hessian's diagonal,
    the inputs' mean square). Clipping a group's outlier buys a finer step for the other 31 weights; on the
    bench's trained Llama this took round to nearest from +1.61% to +0.33% perplexity and GPTQ
    from +1.31% to +0.40% (symmetric int4, groups of 32)."""
    maxq = 2 ** bits - 1
    weight = torch.ones_like(w[:1]) if importance is None else \
        importance[None, :] if importance.dim() == 1 else importance
    best = _range_grid(w, bits, symmetric, 1.0)
    best_error = _rounding_error(w, *best, maxq, weight)
    for step in range(1, CLIP_STEPS):
        scale, zero = _range_grid(w, bits, symmetric, 1.0 - (1.0 - CLIP_MIN) * step / (CLIP_STEPS - 1))
        error = _rounding_error(w, scale, zero, maxq, weight)
        better = error < best_error
        best = (torch.where(better, scale, best[0]), torch.where(better, zero, best[1]))
        best_error = torch.minimum(error, best_error)
    return best


def _range_grid(w: torch.Tensor, bits: int, symmetric: bool, shrink: float
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The grid covering each row's range times `shrink`."""
    maxq = 2 ** bits - 1
    if symmetric:
        absmax = w.abs().amax(dim=1).clamp(min=1e-8) * shrink
        # bfloat16-exact: LiteRT's int4 kernels compute with bf16 scales (litert_grid.py), so
        # the integers are chosen for the scale the runtime uses; float32 stores it exactly
        scale = (absmax / (maxq // 2)).to(torch.bfloat16).to(w.dtype)
        return scale, torch.full_like(scale, (maxq + 1) // 2)
    low, high = w.amin(dim=1).clamp(max=0) * shrink, w.amax(dim=1).clamp(min=0) * shrink
    scale = ((high - low) / maxq).clamp(min=1e-8)
    return scale, torch.round(-low / scale).clamp(0, maxq)


def _rounding_error(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, maxq: int,
                    weight: torch.Tensor) -> torch.Tensor:
    codes = _on_grid(w, scale[:, None], zero[:, None], maxq)
    return (((codes - zero[:, None]) * scale[:, None] - w) ** 2 * weight).sum(dim=1)


def _on_grid(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, maxq: int) -> torch.Tensor:
    return torch.clamp(torch.round(w / scale) + zero, 0, maxq)


def gram(x: torch.Tensor) -> torch.Tensor:
    """X^T X of inputs x [..., K] (float32 [K, K]): the Hessian GPTQ takes, summed per batch."""
    rows = x.reshape(-1, x.shape[-1]).to(torch.float32)
    return rows.T @ rows


def rtn(weight: torch.Tensor, bits: int, group_size: int, symmetric: bool = False,
        importance: torch.Tensor | None = None) -> QuantizedLinear:
    """Round to nearest on each group's searched grid (grid_params; `importance` [K]: each
    input's mean square, which weights the clip search), RTN_ROWS rows at a time: the float32
    temporaries stay a few MB, not several copies of a 32000 x 2048 lm_head (~1 GB), and the
    codes are packed as they come (never one byte per weight for the whole matrix)."""
    n, k = weight.shape
    packed = torch.empty(n, k * bits // 8, dtype=torch.uint8)
    scales = torch.empty(n, k // group_size, dtype=torch.float32)
    zeros = torch.empty(n, k // group_size, dtype=torch.uint8)
    for start in range(0, n, RTN_ROWS):
        rows = slice(start, min(start + RTN_ROWS, n))
        groups = weight[rows].detach().to(torch.float32).reshape(-1, group_size)
        scale, zero = grid_params(groups, bits, symmetric, _tiled(importance, rows.stop - rows.start, group_size))
        codes = _on_grid(groups, scale[:, None], zero[:, None], 2 ** bits - 1)
        packed[rows] = pack_codes(codes.reshape(-1, k).to(torch.uint8), bits)
        scales[rows] = scale.reshape(-1, k // group_size)
        zeros[rows] = zero.reshape(-1, k // group_size).to(torch.uint8)
    return QuantizedLinear.from_packed(packed, scales, zeros, bits, group_size)


def _tiled(importance: torch.Tensor | None, rows: int, group_size: int) -> torch.Tensor | None:
    """Per-input importance [K] for `rows` weight rows cut into groups ([rows * K/g, g], as
    rtn reshapes them): each group row gets its own columns' slice."""
    if importance is None:
        return None
    per_group = importance.to(torch.float32).reshape(-1, group_size)
    return per_group.repeat(rows, 1)


def int8_rows(weight: torch.Tensor, group_size: int) -> QuantizedLinear:
    """Symmetric int8 with one scale per output row (absmax / 127), stored as `group_size`
    blocks that repeat it: an int4 recipe's matrices kept at 8 bits (mixed.py). Both runtimes
    hold it exactly: MatMulNBits takes any block scales, LiteRT's int8 kernels one scale per
    row (litert_grid.on_litert_grid sees the repeated scales), and so do llama.cpp's Q8_0 blocks
    once the scale is float16-exact (gguf_pack.py), which it is made here (a float16 rounding
    before the integers are chosen for it)."""
    w = weight.detach().to(torch.float32)
    n, k = w.shape
    absmax = w.abs().amax(dim=1, keepdim=True).expand(n, k // group_size)
    return _int8_symmetric(w, absmax, group_size)


def int8_blocks(weight: torch.Tensor, block: int) -> QuantizedLinear:
    """Symmetric int8 with a scale per `block` inputs of a row (absmax / 127, float16-exact):
    llama.cpp's Q8_0 at block 32, which its own quantizer makes the same way; MatMulNBits holds
    it too, a .tflite rounds it again onto one scale per row."""
    w = weight.detach().to(torch.float32)
    n, k = w.shape
    return _int8_symmetric(w, w.reshape(n, k // block, block).abs().amax(dim=-1), block)


def _int8_symmetric(w: torch.Tensor, absmax: torch.Tensor, block: int) -> QuantizedLinear:
    """Codes 1..255 around zero point 128 for per-block absmax [N, K / block]; the scales are
    made float16-exact (at least float16's smallest normal) before the codes are chosen."""
    n, k = w.shape
    scales = (absmax / 127).clamp(min=2.0 ** -14).to(torch.float16).to(torch.float32).contiguous()
    groups = w.reshape(n, k // block, block)
    codes = torch.clamp(torch.round(groups / scales[..., None]) + 128, 1, 255).to(torch.uint8)
    zeros = torch.full((n, k // block), 128, dtype=torch.uint8)
    return QuantizedLinear(codes.reshape(n, k), scales, zeros, 8, block)


def output_error(weight: torch.Tensor, quantized: QuantizedLinear,
                 importance: torch.Tensor | None) -> float:
    """How far a matrix's outputs move when it is stored as `quantized`, relative to the
    outputs: sum_k H_kk |dW[:, k]|^2 / sum_k H_kk |W[:, k]|^2, with H_kk the inputs' mean
    square per column (uniform without calibration). The diagonal keeps it O(N K), so it
    ranks a 7B model's matrices in seconds."""
    w = weight.detach().to(torch.float32)
    delta = quantized.dequantize().to(torch.float32) - w
    h = torch.ones(w.shape[1]) if importance is None else importance.to(torch.float32)
    moved = float(((delta ** 2).sum(dim=0) * h).sum())
    return moved / max(float(((w ** 2).sum(dim=0) * h).sum()), 1e-30)


def gptq(weight: torch.Tensor, hessian: torch.Tensor, bits: int, group_size: int,
         symmetric: bool = False, act_order: bool = False) -> QuantizedLinear:
    """GPTQ with groups: each group's grid is set from its (error-updated) weights when the
    group's first column is reached, columns in input order; or with `act_order`, columns in
    order of falling input energy (the Hessian's diagonal: the columns whose errors the
    others can absorb go first) on grids set beforehand from the original weights ("static
    groups": the artifact's groups stay contiguous, only the order of rounding changes)."""
    w = weight.detach().to(torch.float32).clone()
    n, k = w.shape
    maxq = 2 ** bits - 1
    h = hessian.to(torch.float32).clone()
    dead = torch.diag(h) == 0            # inputs that were always zero: any value is exact
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    importance = torch.diag(h)
    scales = torch.zeros(n, k // group_size)
    zeros = torch.zeros(n, k // group_size, dtype=torch.uint8)
    order = torch.arange(k)
    if act_order:
        for g in range(k // group_size):
            cols = slice(g * group_size, (g + 1) * group_size)
            scale, zero = grid_params(w[:, cols], bits, symmetric, importance[cols])
            scales[:, g], zeros[:, g] = scale, zero.to(torch.uint8)
        order = torch.argsort(importance, descending=True, stable=True)
        w, h = w[:, order], h[order][:, order]
    h_inv = _inverse_cholesky(h)
    q = torch.zeros(n, k, dtype=torch.uint8)
    block = max(GPTQ_BLOCK, group_size)
    for start in range(0, k, block):
        stop = min(start + block, k)
        w_block = w[:, start:stop].clone()
        errors = torch.zeros_like(w_block)
        h_block = h_inv[start:stop, start:stop]
        for i in range(stop - start):
            column = int(order[start + i])
            group = column // group_size
            if not act_order and column % group_size == 0:
                scale, zero = grid_params(w_block[:, i:i + group_size], bits, symmetric,
                                          importance[column:column + group_size])
                scales[:, group], zeros[:, group] = scale, zero.to(torch.uint8)
            scale, zero = scales[:, group], zeros[:, group].to(torch.float32)
            codes = _on_grid(w_block[:, i], scale, zero, maxq)
            q[:, column] = codes.to(torch.uint8)
            error = (w_block[:, i] - (codes - zero) * scale) / h_block[i, i]
            w_block[:, i:] -= error[:, None] * h_block[i, i:][None, :]
            errors[:, i] = error
        w[:, stop:] -= errors @ h_inv[start:stop, stop:]
    return QuantizedLinear(q=q, scales=scales, zeros=zeros, bits=bits, group_size=group_size)


def _inverse_cholesky(h: torch.Tensor) -> torch.Tensor:
    """The upper Cholesky factor of H^-1 (GPTQ's update rows), damped until H is positive
    definite (calibration text too short for a layer's width leaves H singular)."""
    damp = GPTQ_DAMP * torch.mean(torch.diag(h))
    eye = torch.eye(len(h))
    for _ in range(6):
        factor, info = torch.linalg.cholesky_ex(h + damp * eye)
        if not info:
            inverse = torch.cholesky_inverse(factor)
            return torch.linalg.cholesky(inverse, upper=True)
        damp *= 10
    raise ValueError("the calibration Hessian is not positive definite")   # unreachable in practice

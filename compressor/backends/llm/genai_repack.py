"""A fast, exact stand-in for onnxruntime-genai 0.18.0's GPTQ re-pack, used while our builder
call runs.

The builder turns each GPTQ linear into MatMulNBits tensors by unpacking it to int32,
dequantizing to float, rounding back to integers and packing again (loaders/base.py
`repack_quantized_tensor`), in torch on whole [K, N] matrices: 52 s and ~4x the bf16 model
in temporaries for a 156M-parameter model on two loaded cores. Its result is a pure bit
re-arrangement of the GPTQ integers (the rounding returns them exactly: the scales are
float32 here), so this does that re-arrangement directly, in column chunks:

  qweight int32 [K/pack, N] (GPTQ)   -> uint8 [N, K/g, g*bits/8], the lower k in the low bits
  qzeros  int32 [K/g, N/pack] (z-1)  -> uint8 [N * ceil(K/g*bits/8)], same packing, z back
  scales  [K/g, N]                   -> [N * K/g]

tests/llm/test_genai_route.py checks the artifact is byte-identical to the builder's own.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np

COLUMN_CHUNK = 2048   # output columns per step: bounds the temporaries to K x 2048 values


def _unpack_rows(packed: np.ndarray, bits: int) -> np.ndarray:
    """int32 [R, C] holding 32/bits values each (value j at bit bits*j) -> uint8 [R*pack, C]."""
    pack = 32 // bits
    words = packed.view(np.uint32)
    shifts = (np.arange(pack, dtype=np.uint32) * bits)[None, :, None]
    values = (words[:, None, :] >> shifts) & np.uint32((1 << bits) - 1)
    return values.reshape(words.shape[0] * pack, words.shape[1]).astype(np.uint8)


def _pack_bytes(values: np.ndarray, bits: int) -> np.ndarray:
    """uint8 [R, C] of `bits`-bit values -> uint8 [R, ceil(C*bits/8)], lower column in the low bits."""
    if bits == 8:
        return values
    if values.shape[1] % 2:
        values = np.pad(values, ((0, 0), (0, 1)))
    return values[:, 0::2] | (values[:, 1::2] << 4)


def ort_tensors(qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray, bits: int,
                group: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """MatMulNBits (B, zero points, scales) of one GPTQ linear, as the builder stores them."""
    k, n = qweight.shape[0] * 32 // bits, qweight.shape[1]
    blocks = k // group
    b = np.empty((n, blocks, group * bits // 8), dtype=np.uint8)
    for lo in range(0, n, COLUMN_CHUNK):
        q = _unpack_rows(np.ascontiguousarray(qweight[:, lo:lo + COLUMN_CHUNK]), bits)   # [K, c]
        b[lo:lo + q.shape[1]] = _pack_bytes(np.ascontiguousarray(q.T), bits).reshape(-1, blocks,
                                                                                  group * bits // 8)
    stored = _unpack_rows(np.ascontiguousarray(qzeros.T), bits).T          # [K/g, N]: zero - 1
    zeros = ((stored.astype(np.int16) + 1) & ((1 << bits) - 1)).astype(np.uint8)
    zero_points = _pack_bytes(np.ascontiguousarray(zeros.T), bits).reshape(-1)
    return b, zero_points, np.ascontiguousarray(scales.T).reshape(-1)


def _repack(self, module, clear_g_idx: bool) -> None:
    """QuantizedModel.repack_quantized_tensor for GPTQ checkpoints without act-order."""
    import torch

    if module.qweight is None:
        return
    b, zero_points, scales = ort_tensors(module.qweight.numpy(), module.qzeros.numpy(),
                                         module.scales.float().numpy(), module.bits, module.group_size)
    module.qweight = torch.from_numpy(b)
    module.qzeros = torch.from_numpy(zero_points)
    module.scales = torch.from_numpy(scales)
    if clear_g_idx:
        module.g_idx = None


@contextlib.contextmanager
def fast_gptq_repack() -> Iterator[None]:
    """GPTQModel's re-pack replaced by `_repack` inside the block (restored after). Only for
    checkpoints written by gptq_format.py: no act-order, group size dividing K, 4 or 8 bits.
    onnxruntime_genai.models puts its folder on sys.path and the builder imports the loaders
    as the top-level `loaders` package, so that is the class patched."""
    import importlib

    import onnxruntime_genai.models  # noqa: F401  (adds the loaders' folder to sys.path)

    classes = {importlib.import_module(name).GPTQModel
               for name in ("loaders.gptq", "onnxruntime_genai.models.loaders.gptq")}
    originals = {cls: cls.__dict__.get("repack_quantized_tensor") for cls in classes}
    for cls in classes:
        cls.repack_quantized_tensor = _repack
    try:
        yield
    finally:
        for cls, original in originals.items():
            if original is None:
                del cls.repack_quantized_tensor
            else:
                cls.repack_quantized_tensor = original

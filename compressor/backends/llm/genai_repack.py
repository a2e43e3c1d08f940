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

from compressor.core.memory import release_file_pages

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
    for used in (module.qweight, module.qzeros, module.scales):
        # safetensors maps the checkpoint: its pages would stay resident beside the re-packed
        # copies until the builder ends (the mapping lives while any tensor of the file does)
        release_file_pages(used.data_ptr(), used.numel() * used.element_size())
    module.qweight = torch.from_numpy(b)
    module.qzeros = torch.from_numpy(zero_points)
    module.scales = torch.from_numpy(scales)
    if clear_g_idx:
        module.g_idx = None


def _nothing_to_quantize(model) -> bool:
    """Whether the builder's graph has no float weight its MatMulNBits quantizer would take
    (a constant weight input of an op type it quantizes): every MatMul of a GPTQ checkpoint
    is MatMulNBits already."""
    kinds = set(model.quant_attrs["op_types_to_quantize"])
    for node in model.model.graph:
        if node.op_type in kinds:
            position = 0 if node.op_type == "Gather" else 1
            weight = node.inputs[position] if len(node.inputs) > position else None
            if weight is not None and weight.const_value is not None:
                return False
    return True


def _patched(cls, name: str, replacement) -> tuple:
    original = cls.__dict__.get(name)
    setattr(cls, name, replacement)
    return cls, name, original


@contextlib.contextmanager
def fast_gptq_repack() -> Iterator[None]:
    """GPTQModel's re-pack replaced by `_repack` inside the block (restored after), and the
    builder's final quantizer pass skipped when it would find nothing to quantize (its input
    and output are a protobuf copy of the whole model beside the model: +1x the artifact in
    memory for no change). Only for checkpoints written by gptq_format.py: no act-order,
    group size dividing K, 4 or 8 bits. onnxruntime_genai.models puts its folder on sys.path
    and the builder imports the loaders / builders as top-level packages, so those classes
    are the ones patched."""
    import importlib

    import onnxruntime_genai.models  # noqa: F401  (adds the loaders' folder to sys.path)

    patches = []
    for package in ("", "onnxruntime_genai.models."):
        gptq = importlib.import_module(f"{package}loaders.gptq").GPTQModel
        model = importlib.import_module(f"{package}builders.base").Model
        to_nbits = model.to_nbits
        patches += [_patched(gptq, "repack_quantized_tensor", _repack),
                    _patched(model, "to_nbits", lambda self, to_nbits=to_nbits:
                             self.model if _nothing_to_quantize(self) else to_nbits(self))]
    try:
        yield
    finally:
        for cls, name, original in reversed(patches):
            if original is None:
                delattr(cls, name)
            else:
                setattr(cls, name, original)

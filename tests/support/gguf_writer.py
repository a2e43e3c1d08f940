"""Write a transformers causal LM and its tokenizer as a .gguf file the way llama.cpp's own tools
do: compressor's GGUF writer (backends/llm/gguf_write.write_file: llama.cpp's names, metadata
and tokenizer) fed weights in F32 / F16 or quantized by the `gguf` package's ports of llama.cpp's
reference quantizers (BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): the files llama.cpp users download,
for tests of GGUF input.

K-quant blocks (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K; 256 weights each) are synthetic: no Python
quantizer exists for them (gguf.quants.quantize raises NotImplementedError), so `k_blocks`
fills each block with random bytes (codes, packed sub-block scales and mins) from a seed and
sets its fp16 super-block scale d (and dmin) from the float block's largest magnitude, so the
weights are finite and of the model's size, but not the float weights. The file's weights are
what gguf.quants.dequantize makes of the blocks, as for any downloaded file. Rows must be a
multiple of 256 wide (a model with hidden and intermediate sizes of 256 multiples). Types no
Python dequantizer reads (UNREADABLE) are written as random bytes, for refusal tests.
"""
from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import numpy as np

TABLES = ("model.embed_tokens.weight", "lm_head.weight")
UNREADABLE = ("Q8_1", "Q8_K")   # no Python quantizer or dequantizer: blocks of random bytes
QK_K = 256
# K-quant -> (block bytes, byte offset of fp16 d, of fp16 dmin or None, largest |code * scale|
# d multiplies, largest sub-block min dmin multiplies): gguf/quants.py's layouts
K_LAYOUT = {
    "Q2_K": (84, 80, 82, 15 * 3, 15),        # scales 16, qs 64, d, dmin
    "Q3_K": (110, 108, None, 32 * 4, 0),     # hmask 32, qs 64, scales 12, d
    "Q4_K": (144, 0, 2, 63 * 15, 63),        # d, dmin, scales 12, qs 128
    "Q5_K": (176, 0, 2, 63 * 31, 63),        # d, dmin, scales 12, qh 32, qs 128
    "Q6_K": (210, 208, None, 128 * 32, 0),   # ql 128, qh 64, int8 scales 16, d
}


def k_blocks(values: np.ndarray, kind: str, seed: int = 0) -> np.ndarray:
    """Synthetic `kind` blocks (uint8 [rows, cols / 256 * block bytes]) for float `values`
    [rows, cols]: random bytes from `seed`, d (and dmin) from each block's largest |value|."""
    size, d_at, dmin_at, span, min_span = K_LAYOUT[kind]
    rows, cols = values.shape
    if cols % QK_K:
        raise ValueError(f"{kind} needs rows a multiple of {QK_K} wide, not {cols}")
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (rows, cols // QK_K, size), dtype=np.uint8)
    peak = np.abs(values.reshape(rows, -1, QK_K)).max(-1).clip(min=1e-3)
    blocks[..., d_at:d_at + 2] = (peak / span).astype(np.float16)[..., None].view(np.uint8)
    if dmin_at is not None:   # mins subtract up to dmin * 63 (Q2_K: 15): about half the peak
        dmin = (peak / 2 / min_span).astype(np.float16)[..., None].view(np.uint8)
        blocks[..., dmin_at:dmin_at + 2] = dmin
    return blocks.reshape(rows, -1)


def write_gguf(model: Any, tokenizer: Any, path: Path, linear: str = "F32",
               embedding: str | None = None, name: str = "tiny", seed: int = 0) -> Path:
    """`linear`: ggml type of the decoder's linear weights; `embedding`: of token_embd and
    output (default: `linear`); norms and biases F32. `seed`: of synthetic K-quant blocks
    (each tensor's own from the seed and its name)."""
    import gguf
    import torch

    from compressor.backends.llm.gguf_write import write_file

    def encode(hf_name: str, tensor: Any) -> tuple[np.ndarray, int, str]:
        values = tensor.detach().to(torch.float32).numpy()
        kind = ((embedding or linear) if hf_name in TABLES else linear) if values.ndim == 2 \
            else "F32"
        qtype = getattr(gguf.GGMLQuantizationType, kind)
        if kind in ("F32", "F16"):
            return values.astype(np.float32 if kind == "F32" else np.float16), int(qtype), kind
        tensor_seed = seed * 7919 + zlib.crc32(hf_name.encode())
        if kind in K_LAYOUT:
            return k_blocks(values, kind, tensor_seed), int(qtype), kind
        if kind in UNREADABLE:   # random bytes: for refusal tests
            shape = gguf.quants.quant_shape_to_byte_shape(values.shape, qtype)
            raw = np.random.default_rng(tensor_seed).integers(0, 256, shape, dtype=np.uint8)
            return raw, int(qtype), kind
        return gguf.quants.quantize(values, qtype), int(qtype), kind

    return write_file(model, tokenizer, Path(path), encode, name=name)


def write_header_only(path: Path, architecture: str) -> Path:
    """A well-formed .gguf with metadata and no tensors (for refusal tests)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("header-only")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

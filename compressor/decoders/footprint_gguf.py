"""Bytes of the .gguf compressor's GGUF route writes for a language model
(backends/llm/gguf_write.py), by the same per-tensor walk as the ONNX artifact
(footprint.weight_bytes), and llama.cpp's KV cache at its two common types.

- int4: Q4_0, 18 bytes per 32 weights (a float16 scale and 16 bytes of nibbles) whatever the
  recipe's group (a group of 128 is four blocks repeating its scale); a recipe's int8
  matrices Q8_0 (34 bytes per 32), counted by the int8 share as ONNX's is, translated.
- int8: Q8_0; fp16: F16; fp32: F32. Norms and biases F32, no rotary tables (llama.cpp
  computes them; Llama 3's frequency factors are rotary_dim / 2 float32 values).
- A tied embedding is one tensor (token_embd), which llama.cpp also reads as the output head.
- Metadata: the header and one entry per tensor (name, dims, type, offset, alignment), the
  tokenizer as llama.cpp's token / type / merge lists, and the tokenizer files themselves
  (compressor.tokenizer.*: what `compress generate` reads): about 1.45x the files' bytes.

tests/llm/test_plan_matches_exports.py holds gguf_bytes within 2% of the written files.
"""
from __future__ import annotations

from dataclasses import replace

from compressor.decoders.footprint import F16, F32, Layout, Storage, weight_bytes
from compressor.decoders.shapes import ModelShape
from compressor.decoders.storage import WeightStorage

Q4_0 = Storage(4, 32, scale_bytes=2)
Q8_0 = Storage(8, 32, scale_bytes=2)
HEADER_BYTES = 2_048             # magic, counts, hyperparameters, alignment
TENSOR_ENTRY_BYTES = 72          # name (~24), dims, type, offset, + data alignment (~16)
# the tokenizer files under compressor.tokenizer.* once, plus llama.cpp's token / type / merge
# lists (about 0.45x the files on the tests' 512-token BPE; measured 35.7 kB of metadata for
# 22.4 kB of files)
TOKENIZER_COPIES = 1.45
# llama.cpp's KV cache types (--cache-type-k / -v): bytes per element
LLAMA_CPP_KV_TYPES = {"f16": 2.0, "q8_0": 34 / 32}


def gguf_layout(recipe: str, storage: WeightStorage) -> Layout:
    """The layout of the GGUF route's file for a recipe whose scheme stores its weights as
    `storage`."""
    grid = storage.linears
    if not grid.quantized:
        weights = F32 if grid.bits == 32 else F16
    else:
        weights = Q8_0 if grid.bits == 8 else Q4_0
    return Layout(recipe, weights, weights, weights, 4, HEADER_BYTES, 0, accuracy_rank=0,
                  gathers_quantized=True, rope_tables=False,
                  int8_budget=storage.int8_budget if grid.bits == 4 else 1.0)


def gguf_bytes(shape: ModelShape, layout: Layout, tokenizer: int) -> int:
    """Bytes of the model.gguf for a recipe (`layout`: its gguf_layout, int8_budget the
    recipe's, fitted or not); `tokenizer`: the tokenizer files' bytes
    (footprint_tflite.tokenizer_bytes)."""
    # the int8 share is spent in ONNX bytes (float32 scales per group of 32 at int4, per 128
    # at int8): the same matrices cost Q4_0 -> Q8_0 a larger share of the Q4_0 file
    onnx = (1 + 4 / 128) / (0.5 + 4 / 32) - 1
    gguf = (34 / 32) / (18 / 32) - 1
    budget = 1 + (layout.int8_budget - 1) * gguf / onnx
    tensors = 2 + shape.num_layers * (7 + shape.norms_per_layer + 2 * shape.qk_norm
                                      + len(shape.biases))
    sized = replace(layout, graph_bytes=HEADER_BYTES + tensors * TENSOR_ENTRY_BYTES,
                    int8_budget=budget)
    return weight_bytes(shape, sized).total + round(TOKENIZER_COPIES * tokenizer)


def llama_cpp_kv_bytes(shape: ModelShape, context: int) -> dict[str, int]:
    """llama.cpp's KV cache at `context` tokens for each of its common cache types (every
    layer keeps the whole context: llama.cpp's default, no sliding-window trim)."""
    elements = shape.num_layers * 2 * shape.num_kv_heads * shape.head_dim * context
    return {kind: round(elements * size) for kind, size in LLAMA_CPP_KV_TYPES.items()}

"""Bytes of the model.tflite compressor's LiteRT route writes for a language model
(backends/llm/litert*.py: litert-torch export_hf with prefill_<T> and decode signatures, then
our integers put where LiteRT computes with them), by the same per-tensor walk as the ONNX
artifact (footprint.weight_bytes) over a second layout table.

- int4: INT4 packed two to a byte, one float16 scale per block of 32 (int4) or 128
  (int4_g128) in a shared scale buffer, zero point 0 (our asymmetric integers are rounded
  again onto LiteRT's symmetric grid: same bytes).
- int8: INT8 per output row; its float32 scale and int64 zero point live in the tensor's
  quantization parameters, written once per signature reading it (prefill + decode).
- fp16: FLOAT16 weights behind DEQUANTIZE; norms, biases stay float32.
- The embedding is quantized like the linears; a tied one is one buffer that the embedding
  lookup and the lm_head read.
- No cos/sin tables: the graph computes them from inv_freq (rotary_dim / 2 float32 values).
- The flatbuffer itself (tensors, their long module-path names, operators, two signatures
  and the rms_norm composites) grows by a fixed amount per decoder layer: fitted to 2- and
  4-layer tiny Llamas and Phi-3s (fused qkv / gate_up: fewer tensors), per precision.
- The metadata table holds the tokenizer files (tokenizer.json, tokenizer_config.json,
  chat_template.jinja, re-saved) and a small lm.json: the plan stats the model folder's
  files, or estimates TOKENIZER_BYTES_PER_TOKEN x vocab_size when there are none.

tests/llm/test_plan_matches_exports.py holds tflite_bytes within 2% of the written files.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from compressor.decoders.footprint import F16, F32, Layout, Storage, weight_bytes
from compressor.decoders.shapes import ModelShape

SIGNATURES = 2                      # prefill_<min(512, context)> and decode
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
# tokenizer.json bytes per vocabulary entry, public files: Llama 3 71, Gemma 68, Phi-3 58,
# Qwen2.5 46, SmolLM2 43, the tests' 512-token BPE 44
TOKENIZER_BYTES_PER_TOKEN = 55
# flatbuffer bytes without weights: (fixed, per decoder layer, per layer when projections
# are fused as Phi-3's), per precision; fitted to 2- and 4-layer tiny Llamas / Phi-3s
# (fp32 = int8's graph: the same tensors and operators; int8's scales are in its Storage)
_GRAPH = {"fp32": (20_500, 80_800, -10_360), "fp16": (20_900, 89_140, -15_380),
          "int8": (20_500, 80_800, -10_360), "int4": (20_900, 89_150, -15_380)}


def litert_layout(recipe: str, precision: str, group_size: int = 32) -> Layout:
    """The layout of the LiteRT route's .tflite for a recipe (graph bytes for unfused
    projections; `for_shape` adjusts them)."""
    fixed, layer, _ = _GRAPH[precision]
    if precision in ("fp32", "fp16"):
        weights = F32 if precision == "fp32" else F16
    elif precision == "int8":   # per row: float32 scale + int64 zero point, per signature
        weights = Storage(8, None, (4 + 8) * SIGNATURES)
    else:
        weights = Storage(4, group_size, 2)
    return Layout(recipe, weights, weights, weights, 4, fixed, layer, accuracy_rank=0,
                  gathers_quantized=True, rope_tables=False)


TFLITE_LAYOUTS: dict[str, Layout] = {
    "fp32": litert_layout("fp32", "fp32"),
    "fp16": litert_layout("fp16", "fp16"),
    "int8": litert_layout("int8", "int8"),
    "int4": litert_layout("int4", "int4", 32),
    "int4_g128": litert_layout("int4_g128", "int4", 128),
}
_PRECISION = {"fp32": "fp32", "fp16": "fp16", "int8": "int8", "int4": "int4", "int4_g128": "int4"}


def for_shape(layout: Layout, shape: ModelShape) -> Layout:
    """`layout` with the graph bytes of `shape`'s family; int4 blocks LiteRT takes (32-256
    dividing every input width, else one scale per row)."""
    layer = layout.graph_bytes_per_layer
    if shape.fused_projections:
        layer += _GRAPH[_PRECISION[layout.recipe]][2]
    weights = layout.linears
    if weights.bits == 4:
        widths = (shape.hidden_size, shape.q_width, shape.intermediate_size)
        fitting = [b for b in (32, 64, 128, 256) if not any(w % b for w in widths)]
        block = min(fitting, key=lambda b: abs(b - weights.group_size)) if fitting else None
        if block is None:      # per channel: float32 scale + int64 zero point per signature
            weights = Storage(4, None, (4 + 8) * SIGNATURES)
        else:
            weights = replace(weights, group_size=block)
    return replace(layout, graph_bytes_per_layer=layer, linears=weights, lm_head=weights,
                   embedding=weights)


def tokenizer_bytes(folder: Path | None, shape: ModelShape) -> int:
    """The tokenizer files the .tflite's metadata carries: those in `folder`, else an estimate
    from the vocabulary size."""
    files = [folder / name for name in TOKENIZER_FILES] if folder else []
    found = [f.stat().st_size for f in files if f.is_file()]
    return sum(found) if found else TOKENIZER_BYTES_PER_TOKEN * shape.vocab_size


def tflite_bytes(shape: ModelShape, recipe: str, tokenizer: int | None = None) -> int | None:
    """Bytes of the model.tflite the LiteRT route writes for `recipe` (None when it has no
    LiteRT layout); `tokenizer`: the tokenizer files' bytes (tokenizer_bytes; None: the
    vocabulary-size estimate)."""
    layout = TFLITE_LAYOUTS.get(recipe)
    if layout is None:
        return None
    if tokenizer is None:
        tokenizer = tokenizer_bytes(None, shape)
    return weight_bytes(shape, for_shape(layout, shape)).total + tokenizer

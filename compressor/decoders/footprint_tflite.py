"""Bytes of the model.tflite compressor's LiteRT route writes for a language model
(backends/llm/litert*.py: litert-torch export_hf with prefill_<T> and decode signatures, then
our integers put where LiteRT computes with them), by the same per-tensor walk as the ONNX
artifact (footprint.weight_bytes) over a second layout table.

- int4: INT4 packed two to a byte, one float16 scale per block (the recipe's group_size, or
  the nearest block LiteRT takes: `litert_block`, which the exporter's litert_grid.py uses) in
  a shared scale buffer, zero point 0 (asymmetric integers are rounded again onto LiteRT's
  symmetric grid: same bytes).
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

The layout is made from the recipe's scheme's storage (decoders/storage.py), as the ONNX one.
tests/llm/test_plan_matches_exports.py holds tflite_bytes within 2% of the written files.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from compressor.decoders.footprint import F16, F32, Layout, Storage, quantized_widths, weight_bytes
from compressor.decoders.shapes import ModelShape
from compressor.decoders.storage import WeightStorage, fitted_group

SIGNATURES = 2                      # prefill_<min(512, context)> and decode
LITERT_BLOCKS = (32, 64, 128, 256)  # the int4 blocks LiteRT's kernels take (else per channel)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
# tokenizer.json bytes per vocabulary entry, public files: Llama 3 71, Gemma 68, Phi-3 58,
# Qwen2.5 46, SmolLM2 43, the tests' 512-token BPE 44
TOKENIZER_BYTES_PER_TOKEN = 55
# flatbuffer bytes without weights: (fixed, per decoder layer, per layer when projections
# are fused as Phi-3's), per precision; fitted to 2- and 4-layer tiny Llamas / Phi-3s
# (fp32 = int8's graph: the same tensors and operators; int8's scales are in its Storage)
_GRAPH = {"fp32": (20_500, 80_800, -10_360), "fp16": (20_900, 89_140, -15_380),
          "int8": (20_500, 80_800, -10_360), "int4": (20_900, 89_150, -15_380)}


def litert_layout(recipe: str, storage: WeightStorage) -> Layout:
    """The layout of the LiteRT route's .tflite for a recipe whose scheme stores its weights
    as `storage` (graph bytes for unfused projections; `for_shape` adjusts them): one grid
    for every weight matrix, the linears' (litert_weights.py writes each on LiteRT's grid)."""
    grid, precision = storage.linears, storage.precision
    if precision not in _GRAPH:
        raise ValueError(f"the TFLite route stores 32-, 16-, 8- or 4-bit weights, not {precision}")
    fixed, layer, _ = _GRAPH[precision]
    if not grid.quantized:
        weights = F32 if grid.bits == 32 else F16
    elif grid.bits == 8:   # per row: float32 scale + int64 zero point, per signature
        weights = Storage(8, None, (4 + 8) * SIGNATURES)
    else:
        weights = Storage(4, grid.group_size, 2)
    return Layout(recipe, weights, weights, weights, 4, fixed, layer, accuracy_rank=0,
                  gathers_quantized=True, rope_tables=False, int8_budget=storage.int8_budget)


def litert_block(group: int | None, widths: tuple[int, ...]) -> int | None:
    """The int4 block LiteRT gets for integers in groups of `group`: the block in
    LITERT_BLOCKS dividing every width nearest to it (the smaller on a tie), None: none
    divides them (per channel)."""
    fitting = [b for b in LITERT_BLOCKS if not any(w % b for w in widths)]
    return min(fitting, key=lambda b: abs(b - (group or 0))) if fitting else None


def for_shape(layout: Layout, shape: ModelShape) -> Layout:
    """`layout` with the graph bytes of `shape`'s family; int4 blocks LiteRT takes (32-256
    dividing every input width, else one scale per row)."""
    layer = layout.graph_bytes_per_layer
    weights = layout.linears
    if shape.fused_projections:
        layer += _GRAPH[_precision(weights)][2]
    budget = layout.int8_budget
    if weights.bits == 4:
        block = litert_block(weights.group_size, quantized_widths(shape))
        if block is None:      # per channel: float32 scale + int64 zero point per signature
            weights = Storage(4, None, (4 + 8) * SIGNATURES)
        else:
            weights = replace(weights, group_size=block)
        width = shape.hidden_size   # a typical K: int8's per-row costs are per K weights
        litert = _int8_share(2 / block if block else 0.0, (4 + 8) * SIGNATURES / width)
        onnx = _int8_share(4 / (layout.linears.group_size or 32),
                           4 / (fitted_group(128, [width]) or width))
        budget = 1 + (budget - 1) * litert / onnx
    return replace(layout, graph_bytes_per_layer=layer, linears=weights, lm_head=weights,
                   embedding=weights, int8_budget=budget)


def _int8_share(scale_bytes_per_weight: float, int8_scale_bytes: float = 0.0) -> float:
    """What int8 adds over int4, as a share of int4's bytes, per weight: the int8 budget is
    spent in the ONNX file's bytes (float32 scales per group; int8 blocks of up to 128), and
    the same matrices cost LiteRT (float16 block scales; int8 per row, with a scale and zero
    point per signature) a larger share."""
    int4 = 0.5 + scale_bytes_per_weight
    return (1 + int8_scale_bytes - int4) / int4


def _precision(weights: Storage) -> str:
    return f"{'fp' if not weights.quantized else 'int'}{weights.bits}"


def tokenizer_bytes(folder: Path | None, shape: ModelShape) -> int:
    """The tokenizer files the .tflite's metadata carries: those in `folder`, else an estimate
    from the vocabulary size."""
    files = [folder / name for name in TOKENIZER_FILES] if folder else []
    found = [f.stat().st_size for f in files if f.is_file()]
    return sum(found) if found else TOKENIZER_BYTES_PER_TOKEN * shape.vocab_size


def tflite_bytes(shape: ModelShape, layout: Layout, tokenizer: int | None = None) -> int:
    """Bytes of the model.tflite the LiteRT route writes for a recipe (`layout`: its
    litert_layout); `tokenizer`: the tokenizer files' bytes (tokenizer_bytes; None: the
    vocabulary-size estimate)."""
    if tokenizer is None:
        tokenizer = tokenizer_bytes(None, shape)
    return weight_bytes(shape, for_shape(layout, shape)).total + tokenizer

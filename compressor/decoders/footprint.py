"""Bytes of a language model per recipe: the artifact as the LLM route's exporter writes it,
the KV cache at a context length, and the runtime's working memory while generating.

The artifact is the folder compressor's ONNX route writes (backends/llm/genai*.py: model.onnx +
model.onnx.data, CPU execution provider): onnxruntime-genai's model builder (0.18.0) fed a
GPTQ-format checkpoint of our integers, then finished by genai_graph.py / genai_fp16.py.
tests/llm/test_plan_matches_exports.py and tests/plan/test_builder_layout.py hold the plan
within 2% of that exporter's files and of the builder's own.

- Linear layers become MatMulNBits: per output row, ceil(K / block) blocks of `block` weights
  packed at `bits` (K padded up to whole blocks), one float32 scale per block, and for
  asymmetric weights one zero point per block at the weight's bit width (symmetric int4, the
  default, stores none: genai_graph.py drops the checkpoint's). The numbers come from the
  recipe's scheme's storage (decoders/storage.py), which the exporter reads too
  (backends/llm/handlers.py `weight_only_plan`).
- The lm_head is ours too (same grid). A tied embedding is the lm_head's matrix (one copy: a
  GatherBlockQuantized reads the MatMulNBits tensors; int4 and int8 are both built at -p int4);
  an untied one becomes a GatherBlockQuantized over our integers (no per-block padding).
  An int4 recipe's int8 share: every matrix but experts at int8_budget x its int4 bytes.
- fp16: a float32 graph, each weight matrix float16 behind a Cast (the rest float32).
- Rotary cos/sin caches: min(max_position_embeddings, context) rows x rotary_dim / 2 (two
  sets for Phi-3 LongRoPE and Gemma 3), cut to the run's context.
- A mixture of experts stores every expert ([E, out, in]); a decode step reads only the
  experts a token is routed to (`WeightBytes.read_per_token`).
- model.onnx itself (the graph, no weights) grows by a fixed amount per decoder layer.
`exporter_layout` turns a recipe's scheme's storage into that table (plan/recipes.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from compressor.decoders.shapes import KINDS, ModelShape, TensorSpec, tensor_inventory
from compressor.decoders.storage import MIN_GROUP, Grid, WeightStorage, fitted_group


@dataclass(frozen=True)
class Storage:
    """How one weight matrix is stored: float at `bits`, or blocks of `group_size` values
    along K quantized to `bits`, with a scale per block and optional zero points."""

    bits: int                        # 32 / 16: float; 8 / 4: quantized
    group_size: int | None = None    # quantized: values per scale along K; None = the whole row
    scale_bytes: int = 4
    zero_point_bits: int = 0         # 0 = symmetric (no zero points)
    fit_group: bool = False          # group = the largest power of two <= group_size dividing
                                     # every input width (the int8 route's choice)

    @property
    def quantized(self) -> bool:
        return self.bits < 16

    def bytes_for(self, rows: int, cols: int) -> int:
        """Bytes of a [rows, cols] matrix quantized along cols (K)."""
        if not self.quantized:
            return rows * cols * self.bits // 8
        group = self.group_size or cols
        blocks = math.ceil(cols / group)
        packed = rows * blocks * math.ceil(group * self.bits / 8)
        scales = rows * blocks * self.scale_bytes
        zeros = rows * math.ceil(blocks * self.zero_point_bits / 8)
        return packed + scales + zeros

    def bytes_for_gather(self, rows: int, cols: int) -> int:
        """GatherBlockQuantized packs the whole [rows, cols] table without per-block padding."""
        if not self.quantized:
            return self.bytes_for(rows, cols)
        blocks = math.ceil(cols / (self.group_size or cols))
        return (rows * math.ceil(cols * self.bits / 8) + rows * blocks * self.scale_bytes
                + rows * math.ceil(blocks * self.zero_point_bits / 8))


@dataclass(frozen=True)
class Layout:
    """What one recipe's artifact stores, tensor kind by tensor kind."""

    recipe: str
    linears: Storage                 # attention and MLP projections
    lm_head: Storage
    embedding: Storage               # float, or int4 (GatherBlockQuantized supports int4 only)
    io_bytes: int                    # norms, biases, rotary caches, KV cache default, logits
    graph_bytes: int                 # model.onnx without weights: fixed part ...
    graph_bytes_per_layer: int       # ... and per decoder layer
    accuracy_rank: int               # higher = closer to the original model
    graph_bytes_qk_norm: int = 0     # per layer with q/k norms (Qwen3, Gemma 3)
    graph_bytes_extra_norm: int = 0  # per norm beyond two per layer (Gemma 2 / 3)
    gathers_quantized: bool = False  # an int4 build: GatherBlockQuantized can read the lm_head
    graph_bytes_bias: int = 0        # per layer with projection biases (the Add nodes)
    graph_bytes_gemma: int = 0       # Gemma's embedding scale and logit soft-cap nodes
    rope_tables: bool = True         # cos/sin caches stored; False: inv_freq only (TFLite)
    int8_budget: float = 1.0         # int4: matrices (not experts) at most x this, int8 mixed in

    def shares_tied_embedding(self, shape: ModelShape) -> bool:
        """The builder's shared_embeddings (on by default for a tied model): one matrix serves
        embedding and lm_head when the lm_head is float (Transpose + Gather), or in an int4
        build, where GatherBlockQuantized reads the quantized lm_head (int4, or int8 with
        matmul_mixed_precision=last_matmul:int8). A plain int8 build cannot quantize a Gather,
        so it stores a float embedding beside its int8 lm_head."""
        return shape.tie_word_embeddings and (not self.lm_head.quantized or self.gathers_quantized)


F32, F16 = Storage(32), Storage(16)
# model.onnx without weights: fixed + per decoder layer, fitted to 2-, 4- and 8-layer builds
# of a Llama (fp16 on the CPU EP builds attention from MatMul / MultiHeadAttention nodes, the
# others use GroupQueryAttention and fused q/k/v), + per layer for q/k norms and extra norms
# (Qwen3 and Gemma 2 builds).
_GRAPH = {"fp32": (3_450, 5_510, 3_570, 760), "fp16": (22_600, 22_410, 2_800, 1_630),
          "quantized": (3_750, 7_280, 3_770, 750)}
# Families whose builds keep RMSNorm weights in float32 even in an fp16 model.
FLOAT32_NORMS = frozenset({"gemma2", "gemma3_text"})


def builder_layout(recipe: str, precision: str, block_size: int = 32, *, symmetric: bool = True,
                   prequantized_zero_points: bool = False, quantize_embedding: bool = False,
                   lm_head: Storage | None = None, accuracy_rank: int = 0) -> Layout:
    """The layout `onnxruntime_genai.models.builder -p PRECISION -e cpu --extra_options
    block_size=B [is_symmetric=false] [op_types_to_quantize=MatMul/Gather]` writes.

    prequantized_zero_points: the input is a GPTQ-format checkpoint (asymmetric, 4-bit zero
    points per group of `block_size`): its linears keep their zero points, while the builder
    quantizes a float lm_head itself (RTN, `symmetric`). lm_head: a Storage of its own (e.g.
    Storage(8, None) for per-row int8), overriding the builder's choice."""
    if precision in ("fp32", "fp16"):
        flt = F32 if precision == "fp32" else F16
        fixed, layer, qk, extra = _GRAPH[precision]
        return Layout(recipe, flt, lm_head or flt, flt, flt.bits // 8, fixed, layer, accuracy_rank,
                      qk, extra)
    bits = {"int8": 8, "int4": 4}[precision]
    rtn = Storage(bits, block_size, 4, 0 if symmetric else bits)
    linears = replace(rtn, zero_point_bits=4) if prequantized_zero_points else rtn
    embedding = Storage(4, block_size, 4, 0 if symmetric else 4) if quantize_embedding else F32
    fixed, layer, qk, extra = _GRAPH["quantized"]
    return Layout(recipe, linears, lm_head or rtn, embedding, 4, fixed, layer, accuracy_rank, qk, extra,
                  gathers_quantized=bits == 4)


# model.onnx without weights as compressor's ONNX route writes it: (fixed, per decoder layer),
# fitted to 2-, 4- and 8-layer tiny Llamas (int8 / int4 built at -p int4; fp16 = the fp32 graph
# + one Cast per weight matrix); + per layer with q/k/v biases (Qwen2), per norm beyond two per
# layer and Gemma's fixed nodes (Gemma 2); q/k norms (Qwen3) as the builder measured above.
_EXPORT_GRAPH = {"fp32": (3_430, 5_360, 3_570), "fp16": (3_540, 6_250, 3_570),
                 "int8": (4_280, 7_770, 3_770), "int4": (4_280, 8_010, 3_770)}
_EXPORT_GRAPH_BIAS, _EXPORT_GRAPH_EXTRA_NORM, _EXPORT_GRAPH_GEMMA = 370, 410, 1_090


def onnx_storage(grid: Grid) -> Storage:
    """A grid as MatMulNBits / GatherBlockQuantized store it: float32 scales, and zero points
    at the weight's own width unless symmetric (genai_graph.py drops symmetric ones)."""
    if not grid.quantized:
        return F32 if grid.bits == 32 else F16
    return Storage(grid.bits, grid.group_size, 4, 0 if grid.symmetric else grid.bits,
                   fit_group=grid.fit_group)


def exporter_layout(recipe: str, storage: WeightStorage) -> Layout:
    """The layout compressor's ONNX route (backends/llm/genai.py) writes for a recipe whose
    scheme stores its weights as `storage`: float32 / float16 (the fp32 build, weights halved
    behind Casts; float32 io), or our integers for every linear, the lm_head and the embedding
    (int4 / int8 both built at -p int4: GatherBlockQuantized reads a tied lm_head)."""
    precision = storage.precision
    if precision not in _EXPORT_GRAPH:
        raise ValueError(f"the ONNX route stores 32-, 16-, 8- or 4-bit weights, not {precision}")
    fixed, layer, qk = _EXPORT_GRAPH[precision]
    return Layout(recipe, onnx_storage(storage.linears), onnx_storage(storage.lm_head),
                  onnx_storage(storage.embedding), 4, fixed, layer, storage.accuracy_rank, qk,
                  _EXPORT_GRAPH_EXTRA_NORM, gathers_quantized=storage.linears.quantized,
                  graph_bytes_bias=_EXPORT_GRAPH_BIAS, graph_bytes_gemma=_EXPORT_GRAPH_GEMMA,
                  int8_budget=storage.int8_budget)


@dataclass(frozen=True)
class WeightBytes:
    by_kind: dict[str, int]          # embedding, lm_head, attention, mlp, norm, bias, router,
    #                                  rotary, graph
    per_layer: tuple[int, ...]       # bytes of each decoder layer (for pipeline splits)
    unread: int = 0                  # bytes of the experts a token is not routed to

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())

    @property
    def read_per_token(self) -> int:
        """Bytes a decode step reads: every weight but the embedding tables (one row of each),
        of a mixture of experts only the experts a token is routed to."""
        return self.total - self.by_kind["embedding"] - self.by_kind["graph"] - self.unread


def _tensor_bytes(t: TensorSpec, layout: Layout, shared: bool, family: str) -> int:
    """Bytes of one tensor; a stack of experts is that many [out, in] matrices."""
    rows, cols = (t.matrix + (1,))[:2]
    mixed = layout.int8_budget if not t.experts else 1.0
    if t.kind in ("attention", "mlp"):
        return max(t.experts, 1) * round(mixed * layout.linears.bytes_for(rows, cols))
    if t.kind == "lm_head":
        return round(mixed * layout.lm_head.bytes_for(rows, cols))
    if t.kind == "embedding":
        return 0 if shared else round(mixed * layout.embedding.bytes_for_gather(rows, cols))
    if t.kind == "norm" and family in FLOAT32_NORMS:
        return t.numel * 4
    return t.numel * layout.io_bytes        # norms, biases, routers: float in the io dtype


def quantized_widths(shape: ModelShape) -> tuple[int, ...]:
    """The input widths (K) of the matrices a quantized recipe stores in blocks: hidden, q and
    intermediate widths for a standard family, one expert's width for a mixture of experts."""
    return tuple(sorted({shape.hidden_size} | {
        t.matrix[-1] for t in tensor_inventory(shape)
        if t.kind in ("attention", "mlp") and len(t.matrix) == 2}))


def _fit_groups(shape: ModelShape, layout: Layout) -> Layout:
    """A layout whose `fit_group` storages take the largest power-of-two group (>= 16) up to
    their group_size that divides every quantized input width (Grid.group_for, which the
    exporter's quantize.widest_group applies to the model's own widths)."""
    if not layout.linears.fit_group:
        return layout
    group = fitted_group(layout.linears.group_size or shape.hidden_size,
                         quantized_widths(shape)) or MIN_GROUP

    def fit(s: Storage) -> Storage:
        return replace(s, group_size=group) if s.fit_group else s

    return replace(layout, linears=fit(layout.linears), lm_head=fit(layout.lm_head),
                   embedding=fit(layout.embedding))


@lru_cache(maxsize=256)
def weight_bytes(shape: ModelShape, layout: Layout, context: int | None = None) -> WeightBytes:
    """The artifact's bytes (model.onnx + model.onnx.data) by tensor kind, with the rotary
    caches cut to `context` rows as the exporter cuts them (None: max_position_embeddings).
    Cached: a plan asks for the same recipe many times while it searches for the longest
    context that fits."""
    layout = _fit_groups(shape, layout)
    shared = layout.shares_tied_embedding(shape)
    by_kind = dict.fromkeys(KINDS, 0)
    per_layer = [0] * shape.num_layers
    unread = 0
    for t in tensor_inventory(shape):
        # a tied lm_head shares the token table (rows: the vocabulary), not a position table
        size = _tensor_bytes(t, layout, shared and t.shape[0] == shape.vocab_size, shape.family)
        by_kind[t.kind] += size
        unread += round(size * (1 - t.active))
        if t.layer is not None:
            per_layer[t.layer] += size
    by_kind["rotary"] = (sum(min(rows, context or rows) * (shape.rotary_dim // 2) * 2 * layout.io_bytes
                             for rows in shape.rope_cache_rows) if layout.rope_tables
                         else shape.rotary_dim // 2 * 4)
    per_layer_graph = (layout.graph_bytes_per_layer + layout.graph_bytes_qk_norm * shape.qk_norm
                       + layout.graph_bytes_extra_norm * (shape.norms_per_layer - 2)
                       + layout.graph_bytes_bias * bool(shape.biases))
    gemma = layout.graph_bytes_gemma if shape.family.startswith("gemma") else 0
    by_kind["graph"] = layout.graph_bytes + gemma + per_layer_graph * shape.num_layers
    return WeightBytes(by_kind=by_kind, per_layer=tuple(per_layer), unread=unread)


KV_DTYPE_BYTES = {"float32": 4, "float16": 2, "int8": 1}


def kv_cache_bytes(shape: ModelShape, context: int, batch: int = 1, dtype_bytes: int = 2,
                   layers: range | None = None) -> int:
    """layers x 2 (K and V) x kv_heads x head_dim x positions x dtype bytes x batch; a sliding
    layer keeps at most its window of positions."""
    total = 0
    for i in layers if layers is not None else range(shape.num_layers):
        window = shape.layer_windows[i]
        positions = min(context, window) if window else context
        total += 2 * shape.kv_width * positions * dtype_bytes * batch
    return total


# What a generating onnxruntime-genai process holds besides weights, KV cache and activations
# (interpreter, libraries, session, threads, allocator slack): peak RSS minus those of builder-
# made models on x86_64 (1 thread, 0.18.0), 58-70 MB over fp32 / int8 / int4 models of 0.3-135
# MB at contexts 256-4096 (tests/plan/test_rss.py measures it again).
RUNTIME_BASELINE_BYTES = 64 * 2**20
PREFILL_TOKENS = 512   # the prompt processed in one step when planning activations


def activation_bytes(shape: ModelShape, layout: Layout, context: int, batch: int = 1,
                     prefill_tokens: int = PREFILL_TOKENS) -> int:
    """Peak activations of one prefill step of P = min(context, prefill_tokens) tokens: logits
    over the vocabulary for every prompt token, attention probabilities (heads x P x P, fp32),
    and one layer's hidden, q/k/v and MLP tensors (the arena reuses them layer to layer)."""
    tokens = min(context, prefill_tokens)
    p = tokens * batch
    io = layout.io_bytes
    logits = p * shape.vocab_size * io
    probs = shape.num_heads * p * tokens * 4
    layer = p * io * (4 * shape.hidden_size + shape.q_width + 2 * shape.kv_width
                      + 3 * shape.intermediate_size)
    return logits + probs + layer


def working_bytes(shape: ModelShape, layout: Layout, context: int, batch: int = 1,
                  prefill_tokens: int = PREFILL_TOKENS) -> int:
    """Runtime memory beyond weights and KV cache: activations + the runtime's baseline."""
    return activation_bytes(shape, layout, context, batch, prefill_tokens) + RUNTIME_BASELINE_BYTES

"""Per-recipe plans of a language model on one device: bytes, fit, headroom, speed bounds,
the context where each recipe stops fitting, and the recommendation.

Speed figures are upper bounds, not predictions: decode reads every weight (but the embedding
table; of a mixture of experts only the experts a token is routed to) and the KV cache once
per token, so tokens/s <= bandwidth / those bytes; prefill does ~2 ops per weight a token
reads plus attention, so tokens/s <= ops/s / ops per token.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from compressor.config.recipe import Recipe
from compressor.decoders.footprint import (
    KV_DTYPE_BYTES,
    Layout,
    kv_cache_bytes,
    weight_bytes,
    working_bytes,
)
from compressor.decoders.footprint_gguf import gguf_bytes
from compressor.decoders.footprint_tflite import tflite_bytes, tokenizer_bytes as files_bytes
from compressor.decoders.shapes import ModelShape, params_by_kind
from compressor.devices import DeviceProfile
from compressor.plan.recipes import PlannedRecipe, resolve

HEADROOM_FRACTION = 0.05   # the recommendation keeps >= 5% of the usable memory free


@dataclass(frozen=True)
class RecipePlan:
    recipe: str
    weights_bytes: int
    kv_cache_bytes: int
    working_bytes: int
    total_bytes: int
    fits: bool
    headroom_bytes: int
    decode_tokens_per_s_bound: float | None
    prefill_tokens_per_s_bound: float | None
    max_context: int
    tflite_bytes: int | None = None   # the LiteRT route's model.tflite (weights_bytes: ONNX)
    gguf_bytes: int | None = None     # the GGUF route's model.gguf (llama.cpp)
    int8_budget: float = 1.0          # int4: the int8 share counted (the recipe's, fitted)
    accuracy_rank: int = field(default=0, compare=False)   # recommend's order (not in JSON)

    def as_json(self) -> dict:
        return {k: (round(v, 3 if k == "int8_budget" else 1) if isinstance(v, float) else v)
                for k, v in self.__dict__.items() if k != "accuracy_rank"}


RecipeRef = str | Path | Recipe | PlannedRecipe


def layout_for(recipe: RecipeRef) -> Layout:
    """The ONNX artifact's layout of a recipe (a built-in name, fp32, a .yaml path, a Recipe)."""
    return resolve(recipe).onnx


def kv_bytes_of(layout: Layout, kv_dtype: str | None) -> int:
    """KV element bytes: the artifact's own (its io dtype) unless --kv-dtype overrides it."""
    return KV_DTYPE_BYTES[kv_dtype] if kv_dtype else layout.io_bytes


def total_at(shape: ModelShape, layout: Layout, context: int, batch: int, kv_bytes: int,
             weights: int | None = None) -> tuple[int, int, int]:
    """(weights, KV cache, working) bytes while generating at `context` positions (the
    artifact's rotary caches are cut to the context it is exported for)."""
    weights = weight_bytes(shape, layout, context).total if weights is None else weights
    kv = kv_cache_bytes(shape, context, batch, kv_bytes)
    return weights, kv, working_bytes(shape, layout, context, batch)


def max_context(shape: ModelShape, layout: Layout, usable: int, batch: int, kv_bytes: int) -> int:
    """The longest context (at most max_position_embeddings) whose total still fits; 0 when
    not even one position does."""
    def fits(c: int) -> bool:
        return sum(total_at(shape, layout, c, batch, kv_bytes)) <= usable

    lo, hi = 0, shape.max_position_embeddings
    if fits(hi):
        return hi
    while hi - lo > 1:              # the total grows with the context: bisect
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def ops_per_token(shape: ModelShape, context: int) -> float:
    """~2 ops per multiply-add: every linear weight a token reads (lm_head included; of a
    mixture of experts its router and the experts it is routed to) plus attention over half
    the context on average (QK^T and PV)."""
    counts = params_by_kind(shape, active=True)
    linear = counts["attention"] + counts["mlp"] + counts["router"] + \
        shape.vocab_size * shape.hidden_size
    attention = 4 * shape.num_layers * shape.q_width * context / 2
    return 2 * linear + attention


def decode_bound(shape: ModelShape, layout: Layout, profile: DeviceProfile, context: int,
                 batch: int, kv_bytes: int) -> float | None:
    if not profile.memory_bandwidth:
        return None
    read = weight_bytes(shape, layout, context).read_per_token + kv_cache_bytes(shape, context, batch, kv_bytes)
    return profile.memory_bandwidth * batch / read


def prefill_bound(shape: ModelShape, layout: Layout, profile: DeviceProfile, context: int) -> float | None:
    """int8 / int4 artifacts compute in int8 (MatMulNBits accuracy_level 4); float16 io in
    fp16; float32 io (fp32, and the route's fp16: float16 weights, float32 compute) at half
    the fp16 rate (NEON / AVX do twice as many fp16 lanes)."""
    if layout.linears.quantized:
        rate = profile.int8_ops
    else:
        rate = profile.fp16_ops if layout.io_bytes == 2 else (profile.fp16_ops or 0) / 2
    if not rate:
        return None
    return rate / ops_per_token(shape, min(context, 512))


def plan_recipe(shape: ModelShape, recipe: RecipeRef, profile: DeviceProfile, context: int,
                batch: int, kv_dtype: str | None, tokenizer_bytes: int | None = None) -> RecipePlan:
    """tokenizer_bytes: the tokenizer files the .tflite's metadata carries
    (footprint_tflite.tokenizer_bytes; None: estimated from the vocabulary size)."""
    recipe = resolve(recipe)
    kv_bytes = kv_bytes_of(recipe.onnx, kv_dtype)
    usable = profile.llm_budget_bytes
    budget = fitted_int8_budget(shape, recipe.onnx, usable, context, batch, kv_bytes)
    layout = replace(recipe.onnx, int8_budget=budget)
    weights, kv, working = total_at(shape, layout, context, batch, kv_bytes)
    total = weights + kv + working
    return RecipePlan(
        recipe=recipe.name, weights_bytes=weights, kv_cache_bytes=kv, working_bytes=working,
        total_bytes=total, fits=total <= usable, headroom_bytes=usable - total,
        decode_tokens_per_s_bound=decode_bound(shape, layout, profile, context, batch, kv_bytes),
        prefill_tokens_per_s_bound=prefill_bound(shape, layout, profile, context),
        max_context=max_context(shape, replace(layout, int8_budget=1.0), usable, batch, kv_bytes),
        tflite_bytes=tflite_bytes(shape, replace(recipe.tflite, int8_budget=budget),
                                  tokenizer_bytes),
        gguf_bytes=gguf_bytes(shape, replace(recipe.gguf, int8_budget=budget),
                              tokenizer_bytes or files_bytes(None, shape)),
        int8_budget=budget, accuracy_rank=recipe.accuracy_rank)


def fitted_int8_budget(shape: ModelShape, layout: Layout, usable: int, context: int, batch: int,
                       kv_bytes: int) -> float:
    """The recipe's int8_budget, lowered (to 1.0 at least) until the weights, KV cache and
    working memory fit `usable` bytes with the recommendation's headroom (or, where only the
    all-int4 floor does, without it): int8 is bought with memory the device has to spare,
    never at the cost of fitting (an 8B Llama at int4 on an 8 GB board at 4096 tokens)."""
    if layout.int8_budget <= 1.0:
        return layout.int8_budget
    ceiling = sum(total_at(shape, layout, context, batch, kv_bytes))
    spare = usable * (1 - HEADROOM_FRACTION)
    if ceiling <= spare:
        return layout.int8_budget
    floor = sum(total_at(shape, replace(layout, int8_budget=1.0), context, batch, kv_bytes))
    room = (spare if floor <= spare else usable) - floor
    if room <= 0:
        return 1.0
    per_unit = (ceiling - floor) / (layout.int8_budget - 1.0)   # bytes per 1.0 of budget
    return 1.0 + math.floor(room / per_unit * 1000) / 1000


def recommend(plans: list[RecipePlan], usable: int) -> str | None:
    """The most accurate recipe that fits with HEADROOM_FRACTION of the memory to spare."""
    ok = [p for p in plans if p.headroom_bytes >= HEADROOM_FRACTION * usable]
    return max(ok, key=lambda p: p.accuracy_rank).recipe if ok else None

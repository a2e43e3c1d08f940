"""Byte accounting: packed blocks, scales and zero points as MatMulNBits stores them, the KV
cache with sliding windows capped, and the 8B Llama on a Jetson Orin NX 8GB at 4k context."""
from __future__ import annotations

from dataclasses import replace

import pytest

from compressor.devices import get_profile
from compressor.decoders.catalogue import lookup
from compressor.decoders.footprint import (
    RUNTIME_BASELINE_BYTES,
    Storage,
    builder_layout,
    kv_cache_bytes,
    weight_bytes,
    working_bytes,
)
from compressor.decoders.shapes import from_hf_config
from compressor.plan.llm import layout_for, max_context, plan_recipe, recommend
from compressor.plan.split import split_plan
from support.plan_models import TINY_CONFIGS

NX = "jetson-orin-nx-8gb"


def test_storage_pads_k_to_whole_blocks():
    # [N=10, K=576] at int4 / block 128: 5 blocks of 64 bytes per row, a float32 scale each
    assert Storage(4, 128).bytes_for(10, 576) == 10 * 5 * 64 + 10 * 5 * 4
    # asymmetric: 5 zero points of 4 bits -> 3 bytes per row
    assert Storage(4, 128, zero_point_bits=4).bytes_for(10, 576) == 10 * (5 * 64 + 5 * 4 + 3)
    assert Storage(8, 32).bytes_for(2, 64) == 2 * 2 * 32 + 2 * 2 * 4
    assert Storage(8, None).bytes_for(3, 100) == 3 * (100 + 4)       # per-row int8
    assert Storage(16).bytes_for(3, 5) == 30
    # GatherBlockQuantized packs the table without per-block padding
    assert Storage(4, 32).bytes_for_gather(512, 128) == 512 * 64 + 512 * 4 * 4


def test_tied_embedding_sharing_follows_the_builder():
    tied = from_hf_config(TINY_CONFIGS["llama"])
    for precision, shared in (("fp32", True), ("fp16", True), ("int4", True), ("int8", False)):
        layout = builder_layout(precision, precision, 32)
        assert weight_bytes(tied, layout).by_kind["embedding"] == (0 if shared else 512 * 128 * 4)
    int8_head = builder_layout("x", "int4", 32, lm_head=Storage(8, 32))    # int4 build gathers it
    assert weight_bytes(tied, int8_head).by_kind["embedding"] == 0
    untied = from_hf_config(TINY_CONFIGS["llama_untied"])
    assert weight_bytes(untied, builder_layout("x", "int4")).by_kind["embedding"] == 512 * 128 * 4
    gathered = builder_layout("x", "int4", quantize_embedding=True)
    assert weight_bytes(untied, gathered).by_kind["embedding"] == 512 * 64 + 512 * 4 * 4


def test_kv_cache_caps_sliding_layers_at_their_window():
    llama = lookup("llama-3.1-8b").shape()
    assert kv_cache_bytes(llama, 4096, 1, 2) == 32 * 2 * 8 * 128 * 4096 * 2 == 536_870_912
    assert kv_cache_bytes(llama, 4096, 2, 1) == 536_870_912        # batch 2 at int8
    gemma = lookup("gemma-2-2b").shape()          # 13 of 26 layers slide over 4096 positions
    per_position_layer = 2 * 4 * 256 * 2
    assert kv_cache_bytes(gemma, 8192, 1, 2) == per_position_layer * (13 * 4096 + 13 * 8192)
    assert kv_cache_bytes(gemma, 2048, 1, 2) == per_position_layer * 26 * 2048


def test_the_8b_llama_on_orin_nx_at_4k():
    shape, nx = lookup("llama-3.1-8b").shape(), get_profile(NX)
    plans = {r: plan_recipe(shape, r, nx, 4096, 1, None) for r in ("fp16", "int8", "int4", "int4_g128")}
    assert not plans["fp16"].fits and not plans["int8"].fits
    assert plans["int4"].fits and plans["int4_g128"].fits
    assert recommend(list(plans.values()), nx.llm_budget_bytes) == "int4"
    int4 = plans["int4"]
    # our int4 everywhere (linears, lm_head, embedding): 0.5 + 4/32 scale bytes per weight
    # (symmetric: no zero points); float32 KV cache of the CPU build
    all_int4 = weight_bytes(shape, replace(layout_for("int4"), int8_budget=1.0), 4096).total
    assert 4.95e9 < all_int4 < 5.1e9 and int4.kv_cache_bytes == 2 * 536_870_912
    # the recipe's int8 share (up to 1.15x) is cut to what leaves the recommendation's 5%
    # headroom on this board: the matrices' bytes grow by int8_budget - 1 and no more
    assert 1.03 < int4.int8_budget < 1.15
    matrices = all_int4 - 2 * 128_256 * 4096 // 10   # ~: what is not a quantized matrix is small
    assert int4.weights_bytes == pytest.approx(all_int4 + (int4.int8_budget - 1) * matrices,
                                               rel=0.01)
    assert 0.05 * nx.llm_budget_bytes <= int4.headroom_bytes < 0.06 * nx.llm_budget_bytes
    assert int4.total_bytes == int4.weights_bytes + int4.kv_cache_bytes + int4.working_bytes
    assert 4096 < int4.max_context < 8192 and plans["fp16"].max_context == 0
    assert 15 < int4.decode_tokens_per_s_bound < 20       # 102.4 GB/s over ~5.9 GB per token
    split = split_plan(shape, layout_for("int8"), nx, 2, 4096, 1, None)
    assert split.fits and [s[:2] for s in split.stages][0][0] == 0 and split.stages[-1][1] == 31
    assert all(s[2] <= nx.llm_budget_bytes for s in split.stages)
    assert split.link_bytes_per_token == 4096 * 4
    assert not split_plan(shape, layout_for("fp16"), nx, 2, 4096, 1, None).fits


def test_max_context_is_where_the_total_crosses_the_budget():
    shape, nx = lookup("llama-3.1-8b").shape(), get_profile(NX)
    layout = layout_for("int4")
    usable, kv = nx.llm_budget_bytes, layout.io_bytes
    c = max_context(shape, layout, usable, 1, kv)

    def total(n):
        return weight_bytes(shape, layout, n).total + kv_cache_bytes(shape, n, 1, kv) + \
            working_bytes(shape, layout, n)
    assert total(c) <= usable < total(c + 1)
    small = lookup("smollm2-135m").shape()         # fits at every position it was trained for
    assert max_context(small, layout, usable, 1, kv) == small.max_position_embeddings


def test_working_memory_is_activations_plus_the_runtime():
    shape = lookup("llama-3.1-8b").shape()
    prefill = working_bytes(shape, layout_for("int4"), 4096) - RUNTIME_BASELINE_BYTES
    assert 512 * 128256 * 4 < prefill < 512 * 128256 * 4 + 200e6    # logits of 512 tokens lead
    assert working_bytes(shape, layout_for("int4"), 16) < working_bytes(shape, layout_for("int4"), 4096)

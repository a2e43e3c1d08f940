"""Families counted from transformers' own model on the meta device (backends/llm/meta_shapes.py
behind decoders/counting.py): OLMo 2's whole-width q/k norms and post-norms, mixtures of
experts (every expert stored, the routed ones read), GPT-2's Conv1D and learned positions,
a causal LM no family entry names (OLMoE); and the standard families' hand tables, the fast
path, equal to the meta count tensor for tensor."""
from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import compressor.plan  # noqa: E402,F401  (installs the meta-device counter)
from compressor.backends.llm.meta_shapes import count  # noqa: E402
from compressor.decoders.catalogue import entries  # noqa: E402
from compressor.decoders.families import find_family  # noqa: E402
from compressor.decoders.footprint import Storage, weight_bytes  # noqa: E402
from compressor.decoders.shapes import (  # noqa: E402
    text_config,
    active_param_count,
    from_hf_config,
    is_language_model,
    param_count,
    params_by_kind,
    tensor_inventory,
)
from compressor.devices import get_profile  # noqa: E402
from compressor.plan.llm import decode_bound, layout_for  # noqa: E402
from support import plan_models  # noqa: E402

BASE = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            pad_token_id=0, bos_token_id=1, eos_token_id=2)
STANDARD = {**plan_models.TINY_CONFIGS,
            "gemma": {**BASE, "model_type": "gemma", "head_dim": 32, "attention_bias": True},
            "granite": {**BASE, "model_type": "granite", "attention_bias": True, "mlp_bias": True},
            "smollm3": {**BASE, "model_type": "smollm3", "mlp_bias": True}}
COUNTED = {"olmo2": {**BASE, "model_type": "olmo2"},
           "qwen3_moe": {**BASE, "model_type": "qwen3_moe", "num_experts": 8,
                         "num_experts_per_tok": 2, "moe_intermediate_size": 64, "head_dim": 32},
           "mixtral": {**BASE, "model_type": "mixtral", "num_local_experts": 4,
                       "num_experts_per_tok": 2},
           "gpt2": {**{k: v for k, v in BASE.items() if k != "intermediate_size"},
                    "model_type": "gpt2"},
           "gpt_neox": {**BASE, "model_type": "gpt_neox"},
           "olmoe": {**BASE, "model_type": "olmoe", "num_experts": 8, "num_experts_per_tok": 2}}


def table(tensors) -> dict:
    return {t.name: (t.kind, t.shape, t.layer, t.tied) for t in tensors}


def test_every_standard_family_equals_the_meta_count_tiny_and_catalogue():
    configs = dict(STANDARD)
    configs.update({f"catalogue {n}": e.config for n, e in entries().items()
                    if getattr(find_family(text_config(e.config)["model_type"]), "layout", "") == "standard"})
    assert {"catalogue gemma-7b", "catalogue granite-3.1-2b", "catalogue smollm3-3b"} <= set(configs)
    for name, config in configs.items():
        shape = from_hf_config(config)
        assert not shape.inventory, name                       # the fast path: no framework
        numbers, counted = count(text_config(config))
        assert table(tensor_inventory(shape)) == table(counted), name
        got = (shape.hidden_size, shape.num_heads, shape.num_kv_heads, shape.head_dim,
               shape.num_layers, shape.vocab_size, shape.intermediate_size,
               shape.max_position_embeddings, shape.tie_word_embeddings)
        assert got == tuple(numbers[k] for k in (
            "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "num_hidden_layers", "vocab_size", "intermediate_size", "max_position_embeddings",
            "tie_word_embeddings")), name


@pytest.mark.parametrize("name", sorted(COUNTED))
def test_a_counted_family_counts_what_transformers_builds(name):
    config = COUNTED[name]
    shape = from_hf_config(config)
    assert shape.inventory and shape.family == config["model_type"]
    assert param_count(shape) == plan_models.meta_param_count(plan_models.hf_config(config))
    assert is_language_model(config)
    for recipe in ("fp16", "int8", "int4"):
        assert weight_bytes(shape, layout_for(recipe)).total > 0


def test_olmo2_norms_are_its_own():
    shape = from_hf_config(COUNTED["olmo2"])
    layer0 = {t.name.removeprefix("model.layers.0."): t for t in tensor_inventory(shape)
              if t.layer == 0}
    assert layer0["self_attn.q_norm.weight"].shape == (shape.q_width,) == (128,)   # whole width
    assert layer0["self_attn.k_norm.weight"].shape == (shape.kv_width,) == (64,)
    norms = {n for n, t in layer0.items() if t.kind == "norm" and "self_attn" not in n}
    assert norms == {"post_attention_layernorm.weight", "post_feedforward_layernorm.weight"}
    assert shape.qk_norm and shape.norms_per_layer == 2


def test_a_mixture_of_experts_stores_every_expert_and_reads_the_routed_ones():
    shape = from_hf_config(COUNTED["qwen3_moe"])
    experts = [t for t in tensor_inventory(shape) if t.experts]
    assert {t.name.rsplit(".", 1)[1] for t in experts} == {"gate_up_proj", "down_proj"}
    gate_up = next(t for t in experts if t.name.endswith("gate_up_proj"))
    assert gate_up.shape == (8, 128, 128) and gate_up.matrix == (128, 128)   # [E, 2 x 64, 128]
    assert (gate_up.experts, gate_up.active_experts, gate_up.active) == (8, 2, 0.25)
    routers = [t for t in tensor_inventory(shape) if t.kind == "router"]
    assert [t.shape for t in routers] == [(8, 128)] * 2
    expert_params = sum(t.numel for t in experts)
    assert active_param_count(shape) == param_count(shape) - expert_params * 6 // 8
    assert params_by_kind(shape, active=True)["router"] == params_by_kind(shape)["router"] == 2048
    assert shape.intermediate_size == 64 * 2           # one expert's width x experts per token

    int4 = layout_for("int4")
    w = weight_bytes(shape, int4)
    expert_bytes = sum(8 * Storage(4, 32).bytes_for(*t.matrix) for t in experts)
    assert w.by_kind["router"] == 2048 * 4             # float, never quantized
    assert w.unread == expert_bytes * 6 // 8           # 6 of 8 experts are not read per token
    assert w.read_per_token == w.total - w.by_kind["embedding"] - w.by_kind["graph"] - w.unread
    profile = get_profile("jetson-orin-nx-8gb")
    bound = decode_bound(shape, int4, profile, 256, 1, 4)
    kv = 2 * 2 * shape.kv_width * 256 * 4
    assert bound == pytest.approx(profile.memory_bandwidth / (w.read_per_token + kv))


def test_gpt2_conv1d_learned_positions_and_tied_head():
    shape = from_hf_config(COUNTED["gpt2"])
    by_name = {t.name: t for t in tensor_inventory(shape)}
    c_attn = by_name["transformer.h.0.attn.c_attn.weight"]
    assert c_attn.transposed and c_attn.shape == (384, 128) and c_attn.stored_shape == (128, 384)
    assert by_name["transformer.wpe.weight"].kind == "embedding"
    assert by_name["lm_head.weight"].tied and shape.tie_word_embeddings
    assert shape.rotary_dim == 0 and shape.intermediate_size == 4 * 128   # n_inner: 4 x n_embd
    fp16 = weight_bytes(shape, layout_for("fp16"))
    assert fp16.by_kind["embedding"] == 256 * 128 * 2   # the position table; wte is the lm_head
    assert fp16.by_kind["rotary"] == 0


def test_a_causal_lm_no_family_names_is_counted_and_encoders_are_not():
    shape = from_hf_config(COUNTED["olmoe"])
    assert shape.family == "olmoe" and find_family("olmoe") is None
    assert active_param_count(shape) < param_count(shape)
    assert not is_language_model({"model_type": "bert", "hidden_size": 8})
    assert not is_language_model({"model_type": "no_such_decoder"})


def test_moe_catalogue_entries_count_their_active_parameters():
    for name in ("qwen3-30b-a3b", "olmoe-1b-7b"):
        entry = entries()[name]
        shape = entry.shape()
        assert (param_count(shape), active_param_count(shape)) == \
            (entry.params, entry.active_params), name
    dense = entries()["olmo-2-1b"]
    assert dense.active_params is None and active_param_count(dense.shape()) == dense.params

"""Shapes from configs: every catalogue entry and tiny config of each family counts exactly the
parameters transformers builds, and the family rules (tied defaults, head_dim, biases, sliding
windows, nested text configs) are read as transformers reads them."""
from __future__ import annotations

import pytest

import compressor.plan  # noqa: F401  (installs the meta-device counter the counted entries need)
from compressor.errors import ModelLoadError
from compressor.decoders.catalogue import entries, find, lookup
from compressor.decoders.shapes import (active_param_count, from_hf_config, param_count,
                                       params_by_kind, tensor_inventory)
from support import plan_models

# Counts the model cards / safetensors metadata publish (what users check us against).
PUBLISHED = {"llama-3.2-1b": 1_235_814_400, "llama-3.2-3b": 3_212_749_824,
             "llama-3.1-8b": 8_030_261_248, "qwen2.5-0.5b": 494_032_768,
             "smollm2-135m": 134_515_008, "mistral-7b-v0.1": 7_241_732_096,
             "phi-3-mini-4k": 3_821_079_552, "gemma-2-2b": 2_614_341_888,
             "gemma-7b": 8_537_680_896, "gemma-2b": 2_506_172_416}


def test_catalogue_counts_match_the_published_ones():
    for name, count in PUBLISHED.items():
        assert param_count(lookup(name).shape()) == count, name
    for entry in entries().values():
        assert param_count(entry.shape()) == entry.params, entry.name
        assert "/" in entry.source, entry.name


@pytest.fixture(scope="module")
def meta_count():
    pytest.importorskip("transformers")
    return plan_models.meta_param_count


def meta_active_count(config) -> int:
    """The parameters one token reads, from the model built on the meta device: of each
    stacked expert tensor [experts, ...] num_experts_per_tok of its experts."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() * config.num_experts_per_tok // p.shape[0] if ".experts." in name
               else p.numel() for name, p in model.named_parameters())


@pytest.mark.slow   # imports torch + transformers (the meta-device build itself is fast)
@pytest.mark.parametrize("name", sorted(entries()))
def test_catalogue_entry_equals_transformers_on_the_meta_device(name, meta_count):
    entry = entries()[name]
    config = dict(entry.config)
    if "text_config" in config:     # the decoder of a vision-language model
        config = {**config["text_config"], "architectures": ["Gemma3ForCausalLM"]}
    shape = lookup(name).shape()
    assert param_count(shape) == meta_count(plan_models.hf_config(config)) == entry.params
    if entry.active_params is not None:    # a mixture of experts
        assert active_param_count(shape) == meta_active_count(plan_models.hf_config(config)) \
            == entry.active_params < entry.params


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(plan_models.TINY_CONFIGS))
def test_tiny_config_equals_transformers_on_the_meta_device(name, meta_count):
    shape = from_hf_config(plan_models.TINY_CONFIGS[name], name)
    assert param_count(shape) == meta_count(plan_models.hf_config(name))


def test_the_8b_llama_by_kind():
    shape = lookup("meta-llama/Llama-3.1-8B").shape()
    kinds = params_by_kind(shape)
    assert kinds["embedding"] == kinds["lm_head"] == 128256 * 4096
    assert kinds["attention"] == 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024)
    assert kinds["mlp"] == 32 * 3 * 4096 * 14336 and kinds["bias"] == 0
    assert (shape.num_kv_heads, shape.head_dim, shape.tie_word_embeddings) == (8, 128, False)


def test_family_defaults_when_config_json_leaves_keys_out():
    base = dict(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                num_attention_heads=4)
    gemma2 = from_hf_config({**base, "model_type": "gemma2"})
    assert gemma2.tie_word_embeddings and gemma2.head_dim == 256 and gemma2.norms_per_layer == 4
    assert gemma2.layer_windows == (4096, None) * 3                  # alternating, sliding first
    gemma3 = from_hf_config({**base, "model_type": "gemma3_text", "num_hidden_layers": 12,
                             "sliding_window": 512})
    assert gemma3.layer_windows == ((512,) * 5 + (None,)) * 2 and gemma3.qk_norm  # 5 local : 1 global
    llama = from_hf_config({**base, "model_type": "llama"})
    assert not llama.tie_word_embeddings and llama.head_dim == 16 and llama.num_kv_heads == 4
    assert from_hf_config({**base, "model_type": "qwen3"}).head_dim == 128
    assert from_hf_config({**base, "model_type": "qwen2"}).biases == {"q", "k", "v"}
    assert from_hf_config({**base, "model_type": "mistral"}).layer_windows == (4096,) * 6
    assert from_hf_config({**base, "model_type": "mistral", "sliding_window": None}).layer_windows \
        == (None,) * 6
    qwen = from_hf_config({**base, "model_type": "qwen2", "sliding_window": 32})   # not used ...
    assert qwen.layer_windows == (None,) * 6
    qwen = from_hf_config({**base, "model_type": "qwen2", "sliding_window": 32,  # ... unless asked
                           "use_sliding_window": True, "max_window_layers": 4})
    assert qwen.layer_windows == (None,) * 4 + (32, 32)


def test_phi3_fused_projections_and_longrope_caches():
    shape = lookup("phi-3.5-mini").shape()
    names = {t.name for t in tensor_inventory(shape) if t.layer == 0}
    assert "model.layers.0.self_attn.qkv_proj.weight" in names
    assert "model.layers.0.mlp.gate_up_proj.weight" in names
    assert shape.rope_cache_rows == (131072, 4096)
    phi4 = lookup("phi-4-mini").shape()
    assert phi4.rotary_dim == 96 and phi4.tie_word_embeddings      # partial_rotary_factor 0.75


def test_a_tied_lm_head_is_listed_but_not_counted():
    shape = lookup("smollm2-135m").shape()
    lm_head = [t for t in tensor_inventory(shape) if t.kind == "lm_head"]
    assert lm_head[0].tied and params_by_kind(shape)["lm_head"] == 0


def test_gemma3_reads_the_nested_text_config():
    shape = lookup("gemma-3-4b").shape()
    assert shape.family == "gemma3_text" and shape.num_layers == 34 and shape.hidden_size == 2560
    assert shape.layer_windows.count(None) == 5 and shape.layer_windows[5] is None


def test_names_and_errors():
    assert find("Qwen/Qwen3-8B").name == "qwen3-8b" and find("SmolLM2-135M").name == "smollm2-135m"
    with pytest.raises(ModelLoadError, match="did you mean 'llama-3.1-8b'"):
        lookup("llama-3.1-8")
    with pytest.raises(ModelLoadError, match="model_type 'bert' is not a language-model family"):
        from_hf_config({"model_type": "bert", "hidden_size": 8})
    with pytest.raises(ModelLoadError, match="'num_hidden_layers' = None"):
        from_hf_config({"model_type": "llama", "vocab_size": 8, "hidden_size": 8,
                        "intermediate_size": 8, "num_attention_heads": 2})

"""The GGUF route's per-family extras (gguf_meta.ARCHS names them): each family's own
hyperparameters as llama.cpp reads them, the tensors it stores differently from transformers
(`split`: one parameter as the pieces llama.cpp names, whole rows each, so a quantized tensor's
block rows move as its floats do), and configurations llama.cpp cannot run (`refuse`).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

Pieces = list[tuple[str, np.ndarray]]      # (transformers-style name, stored rows)


def head_dim(config: Any) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rope_parameters(config: Any, layer_type: str = "full_attention") -> dict:
    """The RoPE settings of `layer_type`'s layers (transformers 5 keys Gemma 3's by layer type)."""
    rope = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
                or {})
    return dict(rope.get(layer_type) or {}) if layer_type in rope else rope


def rope_theta(config: Any, layer_type: str = "full_attention") -> float:
    return float(rope_parameters(config, layer_type).get(
        "rope_theta", getattr(config, "rope_theta", None) or 1e4))


def rope_dims(config: Any) -> int:
    """The dimensions of a head RoPE turns (partial_rotary_factor of them: Phi-4-mini, NeoX)."""
    factor = rope_parameters(config).get("partial_rotary_factor", getattr(
        config, "partial_rotary_factor", getattr(config, "rotary_pct", 1.0)))
    return int(head_dim(config) * float(factor or 1.0))


def layer_types(config: Any) -> list[str]:
    return list(getattr(config, "layer_types", None) or ["full_attention"] * int(
        config.num_hidden_layers))


def feed_forward_length(config: Any) -> int:
    """The MLP's width: GPT-2's n_inner, 4 x its width where that is unset."""
    if hasattr(config, "n_inner"):
        return int(config.n_inner or 4 * config.hidden_size)
    return int(config.intermediate_size)


def layer_norm_eps(config: Any) -> float:
    return float(getattr(config, "layer_norm_eps", None) or config.layer_norm_epsilon)


# --- hyperparameters: (writer, config) ----------------------------------------------------------

def gemma2(writer: Any, config: Any) -> None:
    writer.add_attn_logit_softcapping(float(config.attn_logit_softcapping or 0.0))
    writer.add_final_logit_softcapping(float(config.final_logit_softcapping or 0.0))
    writer.add_sliding_window(int(config.sliding_window))


def gemma3(writer: Any, config: Any) -> None:
    """Sliding layers as a per-layer pattern, their own RoPE base; a linear RoPE scaling of the
    global layers (Gemma 3 4B and up)."""
    import gguf

    writer.add_sliding_window(int(config.sliding_window))
    writer.add_sliding_window_pattern([t == "sliding_attention" for t in layer_types(config)])
    writer.add_rope_freq_base_swa(rope_theta(config, "sliding_attention"))
    rope = rope_parameters(config)
    if rope.get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope["factor"]))


def granite(writer: Any, config: Any) -> None:
    writer.add_attention_scale(float(config.attention_multiplier))
    writer.add_embedding_scale(float(config.embedding_multiplier))
    writer.add_residual_scale(float(config.residual_multiplier))
    writer.add_logit_scale(float(config.logits_scaling))


def phi3(writer: Any, config: Any) -> None:
    """Phi-3's window and LongRoPE: the original context (llama.cpp takes the long factors
    past it) and the attention factor transformers multiplies cos / sin by."""
    if getattr(config, "sliding_window", None):
        writer.add_sliding_window(int(config.sliding_window))
    original = getattr(config, "original_max_position_embeddings", None)
    if original:
        writer.add_rope_scaling_orig_ctx_len(int(original))
    rope = rope_parameters(config)
    if rope.get("rope_type") == "longrope":
        scale = int(config.max_position_embeddings) / int(original)
        attention = rope.get("attention_factor") or (
            1.0 if scale <= 1 else math.sqrt(1 + math.log(scale) / math.log(int(original))))
        writer.add_rope_scaling_attn_factors(float(attention))


def gptneox(writer: Any, config: Any) -> None:
    writer.add_parallel_residual(bool(getattr(config, "use_parallel_residual", True)))


def moe(writer: Any, config: Any) -> None:
    writer.add_expert_count(int(config.num_local_experts))
    writer.add_expert_used_count(int(config.num_experts_per_tok))
    if getattr(config, "moe_intermediate_size", None):
        writer.add_expert_feed_forward_length(int(config.moe_intermediate_size))


# --- configurations llama.cpp cannot run: (config, context) -> why, or None --------------------

def smollm3_refuse(config: Any, context: int | None = None) -> str | None:
    """llama.cpp's smollm3 skips RoPE in every 4th layer (a constant no file can change) and
    attends to the whole context."""
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        return "llama.cpp's smollm3 has no sliding window"
    wanted = [int((i + 1) % 4 != 0) for i in range(int(config.num_hidden_layers))]
    have = [int(x) for x in getattr(config, "no_rope_layers", None) or wanted]
    if have != wanted:
        return ("llama.cpp's smollm3 leaves RoPE out of every 4th layer only; this model's "
                f"no_rope_layers are {have}")
    return None


def window_refuse(config: Any, context: int | None = None) -> str | None:
    """Mistral / Mixtral run as llama.cpp's llama, and Phi-3 with its sliding window disabled
    (llama.cpp PR 13676): full attention, the same model only up to the window. Refused where
    the context the file is validated at (its whole context if none) is longer."""
    window = getattr(config, "sliding_window", None)
    span = int(context or config.max_position_embeddings)
    if window and int(window) < span:
        return (f"llama.cpp runs {config.model_type} without its sliding window, and this "
                f"model's window ({window}) is shorter than the context ({span}); run with "
                f"--context {window} or less")
    return None


GELU = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast")   # llama.cpp: tanh's GELU


def gpt2_refuse(config: Any, context: int | None = None) -> str | None:
    """llama.cpp's gpt2: GELU, attention scaled by 1 / sqrt(head_dim) in every layer."""
    act = getattr(config, "activation_function", "gelu_new")   # config.json may leave it out
    if act not in GELU:
        return f"llama.cpp's gpt2 computes GELU, not {act}"
    if not getattr(config, "scale_attn_weights", True) or getattr(
            config, "scale_attn_by_inverse_layer_idx", False):
        return "llama.cpp's gpt2 scales attention by 1 / sqrt(head_dim) in every layer only"
    return None


def gptneox_refuse(config: Any, context: int | None = None) -> str | None:
    """llama.cpp's gptneox: GELU, qkv / output biases, plain RoPE (no scaling written)."""
    act = getattr(config, "hidden_act", "gelu")
    if act not in GELU:
        return f"llama.cpp's gptneox computes GELU, not {act}"
    if not getattr(config, "attention_bias", True):
        return "llama.cpp's gptneox needs the attention's biases"
    if rope_parameters(config).get("rope_type", "default") != "default":
        return "the GGUF route writes GPT-NeoX with plain RoPE only"
    return None


def qwen3_moe_refuse(config: Any, context: int | None = None) -> str | None:
    """llama.cpp's qwen3moe: every layer a mixture, top-k weights renormalized, no window."""
    if getattr(config, "mlp_only_layers", None) or int(
            getattr(config, "decoder_sparse_step", 1) or 1) != 1:
        return "llama.cpp's qwen3moe has no dense MLP layers (mlp_only_layers, decoder_sparse_step)"
    if not getattr(config, "norm_topk_prob", True):
        return "llama.cpp's qwen3moe always renormalizes the chosen experts' weights"
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        return "llama.cpp's qwen3moe has no sliding window"
    return None


# --- tensors stored otherwise: (config, transformers name, rows) -> pieces ----------------------

def experts(config: Any, name: str, rows: np.ndarray) -> Pieces:
    """transformers 5's stacked experts [E, 2 * I, H] (gate rows, then up) and [E, H, I] as
    llama.cpp's ffn_gate_exps / ffn_up_exps / ffn_down_exps (names the `gguf` map knows)."""
    base, _, last = name.rpartition(".")
    if last == "gate_up_proj":
        half = rows.shape[1] // 2
        return [(f"{base}.gate_proj.weight", rows[:, :half]),
                (f"{base}.up_proj.weight", rows[:, half:])]
    if last == "down_proj":
        return [(f"{base}.down_proj.weight", rows)]
    return [(name, rows)]


def neox_qkv(config: Any, name: str, rows: np.ndarray) -> Pieces:
    """GPT-NeoX's query_key_value rows (weight or bias) [heads, 3, head_dim] as llama.cpp's
    attn_qkv [3, heads, head_dim]: all q rows, then all k, then all v."""
    if not name.endswith(("query_key_value.weight", "query_key_value.bias")):
        return [(name, rows)]
    heads = int(config.num_attention_heads)
    grouped = rows.reshape(heads, 3, rows.shape[0] // heads // 3, *rows.shape[1:])
    return [(name, grouped.swapaxes(0, 1).reshape(rows.shape))]

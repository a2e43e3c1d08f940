"""What a GGUF file says besides its tensors, per decoder family, the way llama.cpp's
convert_hf_to_gguf.py lays it out: the architecture's hyperparameters, the tensors' llama.cpp
names (the `gguf` package's own name map), and what each family changes on the way (Llama's
attn_q / attn_k rows permuted for its rotary pairs, Gemma's norms stored as 1 + w, Llama 3's
RoPE frequency factors as a tensor).

A family the GGUF route does not write yet is refused before any work (decoders/families.py
`missing_routes`); this module is only asked about the ones it writes.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class GgufArch:
    name: str                              # general.architecture
    permute_qk: bool = False               # llama.cpp's llama graph wants q / k rows permuted
    norm_plus_one: bool = False            # HF Gemma computes x * (1 + w); llama.cpp x * w
    extra: Callable[[Any, Any], None] | None = None   # (writer, config): its own hyperparameters


def _gemma2(writer: Any, config: Any) -> None:
    writer.add_attn_logit_softcapping(float(config.attn_logit_softcapping or 0.0))
    writer.add_final_logit_softcapping(float(config.final_logit_softcapping or 0.0))
    writer.add_sliding_window(int(config.sliding_window))


def _granite(writer: Any, config: Any) -> None:
    writer.add_attention_scale(float(config.attention_multiplier))
    writer.add_embedding_scale(float(config.embedding_multiplier))
    writer.add_residual_scale(float(config.residual_multiplier))
    writer.add_logit_scale(float(config.logits_scaling))


ARCHS = {   # config.json model_type -> how llama.cpp names and computes it
    "llama": GgufArch("llama", permute_qk=True),
    "mistral": GgufArch("llama", permute_qk=True),    # llama.cpp runs Mistral as llama
    "qwen2": GgufArch("qwen2"),
    "qwen3": GgufArch("qwen3"),
    "gemma": GgufArch("gemma", norm_plus_one=True),
    "gemma2": GgufArch("gemma2", norm_plus_one=True, extra=_gemma2),
    "granite": GgufArch("granite", extra=_granite),
}


def arch_of(config: Any) -> GgufArch:
    return ARCHS[config.model_type]


def head_dim(config: Any) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rope_parameters(config: Any) -> dict:
    return dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
                or {})


def write_hyperparameters(writer: Any, config: Any, name: str, file_type: int) -> None:
    arch = arch_of(config)
    rope = rope_parameters(config)
    dim = head_dim(config)
    writer.add_name(name)
    writer.add_context_length(int(config.max_position_embeddings))
    writer.add_embedding_length(int(config.hidden_size))
    writer.add_block_count(int(config.num_hidden_layers))
    writer.add_feed_forward_length(int(config.intermediate_size))
    writer.add_head_count(int(config.num_attention_heads))
    writer.add_head_count_kv(int(config.num_key_value_heads))
    writer.add_key_length(dim)
    writer.add_value_length(dim)
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_rope_dimension_count(dim)
    writer.add_rope_freq_base(float(rope.get("rope_theta", getattr(config, "rope_theta", 1e4))))
    writer.add_vocab_size(int(config.vocab_size))
    writer.add_file_type(file_type)
    if arch.extra is not None:
        arch.extra(writer, config)


def rope_factors(config: Any) -> np.ndarray | None:
    """Llama 3's RoPE scaling as llama.cpp takes it: one divisor per frequency (the tensor
    `rope_freqs.weight`); None for any other RoPE."""
    rope = rope_parameters(config)
    if rope.get("rope_type") != "llama3":
        return None
    dim, base = head_dim(config), float(rope.get("rope_theta", 1e4))
    factor, low, high = (float(rope[k]) for k in ("factor", "low_freq_factor", "high_freq_factor"))
    original = float(rope["original_max_position_embeddings"])
    low_wavelength, high_wavelength = original / low, original / high
    factors = []
    for i in range(0, dim, 2):
        wavelength = 2 * math.pi * base ** (i / dim)
        if wavelength < high_wavelength:
            factors.append(1.0)
        elif wavelength > low_wavelength:
            factors.append(factor)
        else:
            smooth = (original / wavelength - low) / (high - low)
            factors.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.asarray(factors, dtype=np.float32)


def permute_rows(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's `permute` of attn_q / attn_k rows (each head's rotary halves interleaved);
    rows may be floats or a quantized tensor's blocks (whole rows either way)."""
    return (rows.reshape(heads, 2, rows.shape[0] // heads // 2, *rows.shape[1:])
            .swapaxes(1, 2).reshape(rows.shape))


def tensor_name(names: Any, hf_name: str) -> str | None:
    """llama.cpp's name of a transformers parameter ("model.layers.0.self_attn.q_proj.weight" ->
    "blk.0.attn_q.weight"), None where llama.cpp has none."""
    base, suffix = hf_name.rsplit(".", 1)
    found = names.get_name(base)
    return None if found is None else f"{found}.{suffix}"


def name_map(config: Any) -> Any:
    import gguf

    arch = arch_of(config).name
    arch_id = next(key for key, value in gguf.MODEL_ARCH_NAMES.items() if value == arch)
    return gguf.get_tensor_name_map(arch_id, int(config.num_hidden_layers))


def row_heads(config: Any, gguf_name: str) -> int | None:
    """The head count whose rotary pairs `gguf_name`'s rows are permuted by, if any."""
    if not arch_of(config).permute_qk:
        return None
    if ".attn_q." in gguf_name:
        return int(config.num_attention_heads)
    if ".attn_k." in gguf_name:
        return int(config.num_key_value_heads)
    return None

"""What a GGUF file says besides its tensors, per decoder family, the way llama.cpp's
convert_hf_to_gguf.py lays it out: the architecture's hyperparameters, the tensors' llama.cpp
names (the `gguf` package's own name map), and what each family changes on the way (Llama's
attn_q / attn_k rows permuted for its rotary pairs, Gemma's norms stored as 1 + w, Llama 3's
RoPE frequency factors as a tensor, GPT-2's Conv1D matrices stored [in, out] turned into rows);
each family's own extras live in gguf_families.py.

A family the GGUF route does not write yet is refused before any work (decoders/families.py
`missing_routes`); this module is only asked about the ones it writes.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import compressor.backends.llm.gguf_families as fam
from compressor.backends.llm.gguf_families import head_dim, rope_dims, rope_parameters, rope_theta


@dataclass(frozen=True)
class GgufArch:
    name: str                              # general.architecture
    permute_qk: bool = False               # llama.cpp's llama graph wants q / k rows permuted
    norm_plus_one: bool = False            # HF Gemma computes x * (1 + w); llama.cpp x * w
    layer_norm: bool = False               # LayerNorm (eps, biases), every head its own K / V
    rope: bool = True                      # False: learned positions (GPT-2's position_embd)
    extra: Callable[[Any, Any], None] | None = None   # (writer, config): its own hyperparameters
    split: Callable[[Any, str, np.ndarray], fam.Pieces] | None = None   # tensors stored otherwise
    refuse: Callable[..., str | None] | None = None   # (config, context) -> why llama.cpp cannot


ARCHS = {   # config.json model_type -> how llama.cpp names and computes it
    "llama": GgufArch("llama", permute_qk=True),
    "mistral": GgufArch("llama", permute_qk=True, refuse=fam.window_refuse),   # as llama
    "mixtral": GgufArch("llama", permute_qk=True, extra=fam.moe, split=fam.experts,
                        refuse=fam.window_refuse),
    "qwen2": GgufArch("qwen2"),
    "qwen3": GgufArch("qwen3"),
    "qwen3_moe": GgufArch("qwen3moe", extra=fam.moe, split=fam.experts,
                          refuse=fam.qwen3_moe_refuse),
    "gemma": GgufArch("gemma", norm_plus_one=True),
    "gemma2": GgufArch("gemma2", norm_plus_one=True, extra=fam.gemma2),
    "gemma3_text": GgufArch("gemma3", norm_plus_one=True, extra=fam.gemma3),
    "granite": GgufArch("granite", extra=fam.granite),
    "phi3": GgufArch("phi3", extra=fam.phi3, refuse=fam.window_refuse),   # fused qkv / gate_up
    "smollm3": GgufArch("smollm3", permute_qk=True, refuse=fam.smollm3_refuse),
    "olmo2": GgufArch("olmo2"),
    "gpt2": GgufArch("gpt2", layer_norm=True, rope=False, refuse=fam.gpt2_refuse),
    # NeoX's fused qkv interleaved per head in transformers, all q, all k, all v in llama.cpp
    "gpt_neox": GgufArch("gptneox", layer_norm=True, extra=fam.gptneox, split=fam.neox_qkv,
                         refuse=fam.gptneox_refuse),
}


def arch_of(config: Any) -> GgufArch:
    return ARCHS[config.model_type]


def refusal(config: Any, context: int | None = None) -> str | None:
    """Why llama.cpp cannot run this model (at `context` tokens) although it runs its family;
    None if it can."""
    arch = ARCHS.get(config.model_type)
    return arch.refuse(config, context) if arch is not None and arch.refuse else None


def pieces(config: Any, hf_name: str, rows: np.ndarray) -> fam.Pieces:
    """The tensors llama.cpp stores for one transformers parameter (itself, most often)."""
    split = arch_of(config).split
    return [(hf_name, rows)] if split is None else split(config, hf_name, rows)


# llama.cpp sets Phi-3's token attributes by general.name (any holding "phi3" / "phi-3") and
# looks these tokens up: a vocabulary without one of them does not load under such a name
PHI3_NAMED_TOKENS = ("</s>", "<unk>", "<s>", "<|endoftext|>")


def file_name(name: str, vocab: dict) -> str:
    """general.name: `name`, "phi 3" for "phi3" / "phi-3" where the vocabulary lacks one of
    PHI3_NAMED_TOKENS (the test models' own tokenizers)."""
    if all(token in vocab for token in PHI3_NAMED_TOKENS):
        return name
    return re.sub(r"(?i)(phi)-?3", r"\1 3", name)


def write_hyperparameters(writer: Any, config: Any, name: str, file_type: int,
                          vocab: dict) -> None:
    arch = arch_of(config)
    writer.add_name(file_name(name, vocab))
    dim = head_dim(config)
    writer.add_context_length(int(config.max_position_embeddings))
    writer.add_embedding_length(int(config.hidden_size))
    writer.add_block_count(int(config.num_hidden_layers))
    writer.add_feed_forward_length(fam.feed_forward_length(config))
    heads = int(config.num_attention_heads)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads if arch.layer_norm else int(config.num_key_value_heads))
    writer.add_key_length(dim)
    writer.add_value_length(dim)
    if arch.layer_norm:
        writer.add_layer_norm_eps(fam.layer_norm_eps(config))
    else:
        writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    if arch.rope:
        writer.add_rope_dimension_count(rope_dims(config))
        writer.add_rope_freq_base(rope_theta(config))
    writer.add_vocab_size(int(config.vocab_size))
    writer.add_file_type(file_type)
    if arch.extra is not None:
        arch.extra(writer, config)


def rope_tensors(config: Any) -> dict[str, np.ndarray]:
    """RoPE scalings llama.cpp takes as tensors: Llama 3's one divisor per frequency
    (`rope_freqs.weight`), LongRoPE's long and short factors (Phi-3); none for other RoPE."""
    rope = rope_parameters(config)
    if rope.get("rope_type") == "longrope":
        return {f"rope_factors_{k}.weight": np.asarray(rope[f"{k}_factor"], dtype=np.float32)
                for k in ("long", "short")}
    if rope.get("rope_type") != "llama3":
        return {}
    dim, base = rope_dims(config), rope_theta(config)
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
    return {"rope_freqs.weight": np.asarray(factors, dtype=np.float32)}


def conv1d_weights(model: Any) -> set[str]:
    """The parameters stored [in, out] (transformers' Conv1D: GPT-2), whose floats llama.cpp
    takes as [out, in] rows (our quantized weights are [out, in] already: QuantizedLinear)."""
    return {f"{name}.weight" for name, module in model.named_modules()
            if type(module).__name__ == "Conv1D"}


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

"""A ModelShape from tensor names and shapes alone (a .safetensors file without config.json):
the Hugging Face names say the family (the registered one they fit: families.py), the shapes
say the widths."""
from __future__ import annotations

import re

from compressor.decoders.families import family_from_tensors
from compressor.errors import ModelLoadError
from compressor.decoders.shapes import LAYER_NORMS, ModelShape, from_hf_config

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def shape_from_tensors(shapes: dict[str, list[int]], name: str, source: str) -> ModelShape:
    """Widths from the tensors themselves. Without config.json the head count is not written
    anywhere: head_dim is taken from a q_norm when there is one, else 128 (or 64) where it
    divides the widths; bytes and speed depend only on heads x head_dim, which the shapes fix.
    max_position_embeddings is unknown and set to 4096."""
    def get(key: str) -> list[int] | None:
        return shapes.get(key)

    embed = get("model.embed_tokens.weight")
    layers = {int(m.group(1)) for k in shapes if (m := _LAYER.match(k))}
    if not embed or not layers:
        raise ModelLoadError(f"{source}: no model.embed_tokens / model.layers tensors in the header; "
                             "not a Hugging Face causal LM checkpoint (put its config.json beside it)")
    p = "model.layers.0."
    vocab, hidden = embed
    o_proj = get(p + "self_attn.o_proj.weight")
    q_width = o_proj[1] if o_proj else hidden
    fused = get(p + "self_attn.qkv_proj.weight") is not None
    if fused:
        kv_width = (get(p + "self_attn.qkv_proj.weight")[0] - q_width) // 2
        inter = get(p + "mlp.gate_up_proj.weight")[0] // 2
    else:
        kv_width = (get(p + "self_attn.k_proj.weight") or [q_width])[0]
        inter = (get(p + "mlp.gate_proj.weight") or get(p + "mlp.up_proj.weight") or [4 * hidden])[0]
    family = family_from_tensors(
        fused, norms=sum(get(f"{p}{norm}.weight") is not None for norm in LAYER_NORMS),
        qk_norm=get(p + "self_attn.q_norm.weight") is not None,
        q_bias=get(p + "self_attn.q_proj.bias") is not None).name
    q_norm = get(p + "self_attn.q_norm.weight")
    head_dim = q_norm[0] if q_norm else next(
        (d for d in (128, 64, 32) if q_width % d == 0 and kv_width % d == 0), q_width)
    config = {"model_type": family, "vocab_size": vocab, "hidden_size": hidden,
              "intermediate_size": inter, "num_hidden_layers": max(layers) + 1,
              "num_attention_heads": q_width // head_dim, "num_key_value_heads": kv_width // head_dim,
              "head_dim": head_dim, "max_position_embeddings": 4096,
              "tie_word_embeddings": "lm_head.weight" not in shapes, "sliding_window": None}
    return from_hf_config(config, name=name, source=f"{source} (shapes from tensor names)")

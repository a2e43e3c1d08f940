"""Our integers read back from a .gguf the GGUF route wrote (Q4_0 / Q8_0 blocks, llama's q / k
rows put back in transformers' order): the check that nothing was rounded a second time."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

# transformers' parameter names -> llama.cpp's, for the standard Llama layout
NAMES = (("model.layers.", "blk."), ("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"),
         ("self_attn.v_proj", "attn_v"), ("self_attn.o_proj", "attn_output"),
         ("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up"), ("mlp.down_proj", "ffn_down"),
         ("model.embed_tokens", "token_embd"))


def gguf_name(hf_name: str) -> str:
    for ours, theirs in NAMES:
        hf_name = hf_name.replace(ours, theirs)
    return hf_name


def assert_holds(path: Path, quantized: dict[str, Any], config: Any) -> int:
    """Every QuantizedLinear in `quantized` is in the file with the same integers and the
    weights they compute (Q4_0 at 4 bits, Q8_0 at 8); returns how many were checked."""
    import gguf
    import torch

    from compressor.backends.llm import gguf_blocks, gguf_pack

    tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    for hf_name, ours in quantized.items():
        name = gguf_name(hf_name)
        tensor = tensors[name]
        raw = np.asarray(tensor.data)
        order = next((gguf_blocks.unpermute_rows(raw.shape[0], h) for key, h in heads.items()
                      if f".{key}." in name), None)
        if order is not None:
            raw = raw[order.numpy()]
        n, k = ours.shape
        if ours.bits == 4:
            assert int(tensor.tensor_type) == gguf_pack.Q4_0, name
            codes, d, _ = gguf_blocks.unpack_blocks(raw, gguf_pack.Q4_0)
            assert torch.equal(codes, ours.q), name
            # the scales too (a block of zeros, the padding token's row, is stored with d = 0)
            assert torch.equal(gguf_blocks.exact_weight(codes, d, None), ours.dequantize()), name
        else:
            assert int(tensor.tensor_type) == gguf_pack.Q8_0, name
            blocks = raw.reshape(n, k // 32, 34)
            codes = blocks[..., 2:].view(np.int8).reshape(n, k).astype(np.int16) + 128
            assert np.array_equal(codes, ours.q.numpy()), name
            d = np.ascontiguousarray(blocks[..., :2]).view(np.float16)[..., 0].astype(np.float32)
            assert np.array_equal(d, ours.scales.numpy().repeat(ours.group_size // 32, 1)), name
    return len(quantized)

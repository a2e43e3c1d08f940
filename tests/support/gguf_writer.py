"""Write a transformers causal LM (llama / qwen2 / qwen3) and its byte-level BPE tokenizer as
a .gguf file, the way llama.cpp's convert_hf_to_gguf.py lays it out: tensor names from gguf's
own name map, llama's attn_q / attn_k rows permuted for rotary pairs, norms in F32, the
tokenizer as `tokenizer.ggml.*` metadata. Linear weights in F32 / F16 / BF16 or quantized by
the gguf package (Q4_0, Q4_1, Q8_0) as llama.cpp's reference quantizers do.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

FLOAT_TYPES = ("F32", "F16")   # BF16, Q4_0, Q4_1, Q8_0: packed by gguf.quants


def permute_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's `permute` of attn_q / attn_k rows (interleaved rotary halves)."""
    return (weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def write_gguf(model: Any, tokenizer: Any, path: Path, linear: str = "F32",
               embedding: str | None = None, architecture: str | None = None,
               name: str = "tiny") -> Path:
    """`linear`: ggml type of the decoder's linear weights; `embedding`: of token_embd and
    output (default: `linear`); `architecture`: general.architecture (default: the config's
    model_type; Mistral is written as `llama`, as llama.cpp does)."""
    import gguf
    import torch

    config = model.config
    architecture = architecture or {"mistral": "llama"}.get(config.model_type,
                                                            config.model_type)
    writer = gguf.GGUFWriter(str(path), architecture)
    _write_hyperparameters(writer, config, name)
    _write_tokenizer(writer, tokenizer)
    arch_id = next((key for key, value in gguf.MODEL_ARCH_NAMES.items()
                    if value == architecture), gguf.MODEL_ARCH.LLAMA)
    names = gguf.get_tensor_name_map(arch_id, config.num_hidden_layers)
    tied = config.tie_word_embeddings
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and tied:
            continue
        base, suffix = hf_name.rsplit(".", 1)
        gguf_name = f"{names.get_name(base)}.{suffix}"
        values = tensor.detach().to(torch.float32).numpy()
        if architecture == "llama" and ".attn_q." in gguf_name:
            values = permute_rows(values, config.num_attention_heads)
        elif architecture == "llama" and ".attn_k." in gguf_name:
            values = permute_rows(values, config.num_key_value_heads)
        is_embedding = gguf_name.split(".")[0] in ("token_embd", "output")
        kind = (embedding or linear) if is_embedding else linear
        _add_tensor(writer, gguf_name, values, kind if values.ndim == 2 else "F32")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_tensor(writer: Any, name: str, values: np.ndarray, kind: str) -> None:
    import gguf

    if kind in FLOAT_TYPES:
        writer.add_tensor(name, values.astype(np.float16 if kind == "F16" else np.float32))
        return
    qtype = getattr(gguf.GGMLQuantizationType, kind)
    writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)


def _write_hyperparameters(writer: Any, config: Any, name: str) -> None:
    rope = getattr(config, "rope_parameters", None) or {}
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_name(name)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(rope.get("rope_theta", getattr(config, "rope_theta", 1e4))))
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(1)


def _write_tokenizer(writer: Any, tokenizer: Any) -> None:
    """A byte-level BPE tokenizer (tokenizers' ByteLevel, GPT-2 split) as llama.cpp's `gpt2`
    tokenizer model; special tokens marked CONTROL (3), the others NORMAL (1)."""
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    special = set(tokenizer.all_special_tokens)
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if token in special else 1 for token in tokens])
    writer.add_token_merges([" ".join(pair) if isinstance(pair, list) else pair
                             for pair in merges])
    for token_id, add in ((tokenizer.bos_token_id, writer.add_bos_token_id),
                          (tokenizer.eos_token_id, writer.add_eos_token_id),
                          (tokenizer.unk_token_id, writer.add_unk_token_id),
                          (tokenizer.pad_token_id, writer.add_pad_token_id)):
        if token_id is not None:
            add(token_id)
    bos = tokenizer.bos_token_id
    writer.add_add_bos_token(bos is not None and tokenizer("a")["input_ids"][:1] == [bos])
    if tokenizer.chat_template:
        writer.add_chat_template(tokenizer.chat_template)


def write_header_only(path: Path, architecture: str) -> Path:
    """A well-formed .gguf with metadata and no tensors (for refusal tests)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("header-only")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

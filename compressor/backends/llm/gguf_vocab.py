"""A transformers tokenizer as GGUF `tokenizer.ggml.*` metadata, so llama.cpp tokenizes on its
own: byte-level BPE (GPT-2 style: Llama 3, Qwen, SmolLM, our examples) as llama.cpp's `gpt2`
model with its merges and pre-tokenizer, SentencePiece-style BPE with byte fallback (Llama 2,
Mistral, Gemma) as its `llama` model (the `gguf` package's LlamaHfVocab reads it). The
tokenizer files themselves ride along under `compressor.tokenizer.*` keys, which llama.cpp
ignores and `compress generate` reads (the same tokenizer as every other artifact).
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from compressor.decoders.gguf_header import GGUF_TOKENIZER_KEY as FILE_KEY
from compressor.errors import BackendUnavailableError

CONTROL, NORMAL = 3, 1                      # llama.cpp token types
# llama.cpp's pre-tokenizer names for the split patterns of common byte-level BPE tokenizers
# (convert_hf_to_gguf.py tells them apart by a hash of their output; the pattern says the same)
PRE_TOKENIZERS = {
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)": "gpt-2",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+": "llama-bpe",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+": "qwen2",
}


def write_tokenizer(writer: Any, tokenizer: Any, vocab_size: int) -> str:
    """Add `tokenizer` to the GGUF being written, exactly `vocab_size` tokens (the model's
    table: llama.cpp checks the two agree; ids past it are dropped, missing ones padded as
    llama.cpp's converter does); returns the pre-tokenizer name used."""
    data = json.loads(tokenizer.backend_tokenizer.to_str())
    model = data["model"]
    if model.get("type") != "BPE":
        raise BackendUnavailableError(
            f"the GGUF route writes BPE tokenizers (byte-level or with byte fallback); this one "
            f"is {model.get('type')}; export onnx or tflite")
    pre = "default"
    if model.get("byte_fallback"):
        _sentencepiece_style(writer, tokenizer)
    else:
        pre = _byte_level(writer, tokenizer, data, vocab_size)
    _special_ids(writer, tokenizer)
    if tokenizer.chat_template:
        template = tokenizer.chat_template
        writer.add_chat_template(template if isinstance(template, str) else
                                 [{"name": k, "template": v} for k, v in template.items()])
    files = _files(tokenizer)
    for name, text in files.items():
        writer.add_string(FILE_KEY + name, text)
    return pre


def _byte_level(writer: Any, tokenizer: Any, data: dict, vocab_size: int) -> str:
    by_id = {i: token for token, i in tokenizer.get_vocab().items()}
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(vocab_size)]
    special = set(tokenizer.all_special_tokens) | {
        t["content"] for t in data.get("added_tokens", []) if t.get("special")}
    merges = data["model"].get("merges", [])
    pre = pre_tokenizer_name(data.get("pre_tokenizer"))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([CONTROL if token in special else NORMAL for token in tokens])
    writer.add_token_merges([" ".join(pair) if isinstance(pair, list) else pair
                             for pair in merges])
    return pre


def pre_tokenizer_name(pre: dict | None) -> str:
    """llama.cpp's name for a tokenizer.json pre_tokenizer: a plain ByteLevel with its regex
    splits as GPT-2 does; a Split by a known pattern (then ByteLevel without a regex) by that
    pattern; "default" otherwise."""
    if not pre:
        return "default"
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    if len(steps) == 1 and steps[0].get("type") == "ByteLevel" and steps[0].get("use_regex", True):
        return "gpt-2"
    split = next((s for s in steps if s.get("type") == "Split"), None)
    pattern = (split or {}).get("pattern", {}).get("Regex")
    return PRE_TOKENIZERS.get(pattern, "default")


def _sentencepiece_style(writer: Any, tokenizer: Any) -> None:
    from gguf.vocab import LlamaHfVocab

    with tempfile.TemporaryDirectory() as folder:
        tokenizer.save_pretrained(folder)
        vocab = LlamaHfVocab(Path(folder))
        tokens, scores, types = [], [], []
        for text, score, kind in vocab.all_tokens():
            tokens.append(text)
            scores.append(score)
            types.append(int(kind))
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)


def _special_ids(writer: Any, tokenizer: Any) -> None:
    for token_id, add in ((tokenizer.bos_token_id, writer.add_bos_token_id),
                          (tokenizer.eos_token_id, writer.add_eos_token_id),
                          (tokenizer.unk_token_id, writer.add_unk_token_id),
                          (tokenizer.pad_token_id, writer.add_pad_token_id)):
        if token_id is not None:
            add(int(token_id))
    bos = tokenizer.bos_token_id
    writer.add_add_bos_token(bos is not None and tokenizer("a")["input_ids"][:1] == [bos])
    writer.add_add_eos_token(False)


def _files(tokenizer: Any) -> dict[str, str]:
    with tempfile.TemporaryDirectory() as folder:
        tokenizer.save_pretrained(folder)
        return {name: (Path(folder) / name).read_text(encoding="utf-8")
                for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
                if (Path(folder) / name).is_file()}

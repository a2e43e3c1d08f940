"""The metadata header of a .gguf file, parsed without reading tensor data, mapped to the
config.json keys `from_hf_config` takes (GGUF spec v2/v3: magic, version, tensor count,
key/value metadata, tensor infos; all little-endian)."""
from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any, BinaryIO

from compressor.decoders.families import gguf_family, registered_families
from compressor.errors import ModelLoadError

# compressor's own keys in the .gguf files it writes (llama.cpp ignores them): the tokenizer
# files (+ "tokenizer.json", ...), read by `compress generate`, and the context the run
# validated, which the llama.cpp runtime sizes its KV cache to
GGUF_TOKENIZER_KEY = "compressor.tokenizer."
GGUF_CONTEXT_KEY = "compressor.context"

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_KEYS = {"block_count": "num_hidden_layers", "embedding_length": "hidden_size",
         "feed_forward_length": "intermediate_size", "attention.head_count": "num_attention_heads",
         "attention.head_count_kv": "num_key_value_heads", "attention.key_length": "head_dim",
         "context_length": "max_position_embeddings", "attention.sliding_window": "sliding_window",
         "vocab_size": "vocab_size"}


class _Reader:
    def __init__(self, f: BinaryIO, size: int, path: Path):
        self.f, self.size, self.path = f, size, path

    def take(self, n: int) -> bytes:
        if n < 0 or self.f.tell() + n > self.size:
            raise ModelLoadError(f"{self.path}: not a valid GGUF header: it reads past the end of "
                                 f"the file ({self.size:,} bytes); the file is truncated or "
                                 "corrupt (download it again)")
        return self.f.read(n)

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.take(self.scalar("<Q")).decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.scalar("<I"), self.scalar("<Q")
            if item in _SCALARS:      # numbers: skip them, keep the length
                self.take(count * struct.calcsize(_SCALARS[item]))
            else:
                for _ in range(count):
                    self.value(item)
            return _Length(count)
        raise ModelLoadError(f"{self.path}: not a valid GGUF header: unknown value type {kind}")


class _Length(int):
    """An array's element count (its values are not kept)."""


def read_gguf(path: Path) -> tuple[dict[str, Any], dict[str, tuple[int, ...]]]:
    """(metadata, tensor name -> shape with the slowest dimension first)."""
    size = os.stat(path).st_size
    with open(path, "rb") as f:
        r = _Reader(f, size, path)
        if r.take(4) != b"GGUF":
            raise ModelLoadError(f"{path}: not a GGUF file (no GGUF magic bytes)")
        version = r.scalar("<I")
        if version not in (2, 3):
            raise ModelLoadError(f"{path}: GGUF version {version} is not supported (2 or 3)")
        n_tensors, n_kv = r.scalar("<Q"), r.scalar("<Q")
        if n_tensors > size or n_kv > size:
            raise ModelLoadError(f"{path}: not a valid GGUF header: {n_tensors:,} tensors and "
                                 f"{n_kv:,} keys cannot fit in {size:,} bytes")
        meta = {}
        for _ in range(n_kv):
            key = r.string()
            meta[key] = r.value(r.scalar("<I"))
        shapes = {}
        for _ in range(n_tensors):
            name = r.string()
            dims = [r.scalar("<Q") for _ in range(r.scalar("<I"))]
            r.scalar("<I")                # ggml type
            if r.scalar("<Q") > size:     # data offset (relative to the data section)
                raise ModelLoadError(f"{path}: not a valid GGUF header: tensor {name!r} starts "
                                     f"beyond the end of the file; the file is truncated")
            shapes[name] = tuple(reversed(dims))
    return meta, shapes


def gguf_config(path: Path) -> tuple[dict, int]:
    """config.json keys for the model in a .gguf file, and its parameter count from the header."""
    meta, shapes = read_gguf(path)
    arch = str(meta.get("general.architecture", ""))
    # general.architecture -> the family (llama.cpp writes Mistral as "llama")
    family = gguf_family(arch)
    if family is None:
        known = sorted(f.gguf_architecture for f in registered_families())
        raise ModelLoadError(f"{path}: GGUF architecture {arch!r} is not one compress plan knows "
                             f"({', '.join(known)})")
    config: dict[str, Any] = {"model_type": family.name}
    for key, hf_key in _KEYS.items():
        if f"{arch}.{key}" in meta:
            config[hf_key] = int(meta[f"{arch}.{key}"])
    if "vocab_size" not in config:
        tokens = meta.get("tokenizer.ggml.tokens")
        embedding = shapes.get("token_embd.weight")
        config["vocab_size"] = int(tokens) if tokens else (embedding[0] if embedding else 0)
    config["tie_word_embeddings"] = "output.weight" not in shapes
    config["attention_bias"] = "blk.0.attn_q.bias" in shapes and not family.qkv_bias
    rope_dims = meta.get(f"{arch}.rope.dimension_count")
    heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
    head_dim = config.get("head_dim") or (hidden // heads if heads and hidden else 0)
    if rope_dims and head_dim and rope_dims != head_dim:
        config["partial_rotary_factor"] = rope_dims / head_dim
    params = 0
    for dims in shapes.values():
        n = 1
        for d in dims:
            n *= d
        params += n
    return config, params

"""What a .gguf holds, read back from the file with the `gguf` package: every tensor's llama.cpp
type, its bytes and bits per weight, the weight dtypes as the report names them (Q4_0 / Q4_1 /
Q4_K are "int4", Q8_0 "int8", F16 "float16", ...), and the memory llama.cpp needs to generate
at the file's context (weights, an f16 KV cache, prefill activations, the runtime)."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from compressor.runtimes.base import ArtifactInfo, WeightTensor
from compressor.runtimes.common import RUNTIME_OVERHEAD_BYTES, file_facts, weight_summary
from compressor.runtimes.llamacpp import kv_cache_bytes, read_facts

PREFILL_TOKENS = 512
MATRIX_SUFFIXES = ("attn_q", "attn_k", "attn_v", "attn_output", "attn_qkv", "ffn_gate", "ffn_up",
                   "ffn_down", "token_embd", "output")


def dtype_name(type_name: str) -> str:
    """The report's dtype of a ggml type: Q4_0 -> int4, Q6_K -> int6, F16 -> float16."""
    if type_name.startswith(("Q", "IQ")):
        return f"int{type_name.lstrip('IQ')[0]}"
    return {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}.get(type_name,
                                                                      type_name.lower())


def inspect_gguf(path: Path, sample_shapes=None) -> ArtifactInfo:
    facts = read_facts(Path(path))
    reader = facts["reader"]
    weights, storage = [], defaultdict(lambda: {"tensors": 0, "bytes": 0, "elements": 0})
    for tensor in reader.tensors:
        type_name = tensor.tensor_type.name
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))   # rows first
        is_kernel = tensor.name.split(".")[-2] in MATRIX_SUFFIXES and len(shape) >= 2
        zeros = int(np.count_nonzero(tensor.data == 0)) if type_name in ("F32", "F16") \
            and is_kernel else 0
        weights.append(WeightTensor(tensor.name, dtype_name(type_name), shape, zeros, is_kernel,
                                    reader=type_name))
        entry = storage[type_name]
        entry["tensors"] += 1
        entry["bytes"] += int(tensor.n_bytes)
        entry["elements"] += int(tensor.n_elements)
    for entry in storage.values():
        entry["bits_per_weight"] = round(8 * entry["bytes"] / max(entry.pop("elements"), 1), 3)
    size, gzip_size, sha = file_facts(Path(path))
    params, dtypes, sparsity = weight_summary(weights)
    context = facts["context"]
    kv = kv_cache_bytes(facts, context)
    hidden = int(facts["fields"].get(f"{facts['architecture']}.embedding_length", 0))
    activations = PREFILL_TOKENS * (facts["vocab"] + 8 * hidden) * 4
    total_bytes = sum(e["bytes"] for e in storage.values())
    # multiply-accumulates per token: every matrix but the token table (a lookup), which a
    # tied model multiplies once more as its output head
    table = next((w.size for w in weights if w.name == "token_embd.weight"), 0)
    tied = not any(w.name == "output.weight" for w in weights)
    macs = sum(w.size for w in weights if w.is_kernel) - table + (table if tied else 0)
    return ArtifactInfo(
        format="gguf", path=Path(path), size_bytes=size, gzip_bytes=gzip_size, sha256=sha,
        params=params, weight_dtypes=dtypes, sparsity=sparsity,
        ops={}, inputs=[{"name": "tokens", "shape": [1, -1], "dtype": "int32"}],
        outputs=[{"name": "logits", "shape": [1, -1, facts["vocab"]], "dtype": "float32"}],
        est_peak_memory_bytes=int(total_bytes + kv + activations + RUNTIME_OVERHEAD_BYTES["gguf"]),
        macs=int(macs),
        weights=tuple(weights), storage={k: dict(v) for k, v in sorted(storage.items())})

"""Write a transformers causal LM and its tokenizer as a .gguf file the way llama.cpp's own tools
do: compressor's GGUF writer (backends/llm/gguf_write.write_file: llama.cpp's names, metadata
and tokenizer) fed weights in F32 / F16 or quantized by the `gguf` package's ports of llama.cpp's
reference quantizers (BF16, Q4_0, Q4_1, Q8_0): the files llama.cpp users download, for tests of
GGUF input.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

TABLES = ("model.embed_tokens.weight", "lm_head.weight")


def write_gguf(model: Any, tokenizer: Any, path: Path, linear: str = "F32",
               embedding: str | None = None, name: str = "tiny") -> Path:
    """`linear`: ggml type of the decoder's linear weights; `embedding`: of token_embd and
    output (default: `linear`); norms and biases F32."""
    import gguf
    import torch

    from compressor.backends.llm.gguf_write import write_file

    def encode(hf_name: str, tensor: Any) -> tuple[np.ndarray, int, str]:
        values = tensor.detach().to(torch.float32).numpy()
        kind = ((embedding or linear) if hf_name in TABLES else linear) if values.ndim == 2 \
            else "F32"
        qtype = getattr(gguf.GGMLQuantizationType, kind)
        if kind in ("F32", "F16"):
            return values.astype(np.float32 if kind == "F32" else np.float16), int(qtype), kind
        return gguf.quants.quantize(values, qtype), int(qtype), kind

    return write_file(model, tokenizer, Path(path), encode, name=name)


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

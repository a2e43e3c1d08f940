"""The GGUF route: a language model and its integers as one .gguf file llama.cpp runs on its
own (metadata: gguf_meta.py; tokenizer: gguf_vocab.py; blocks: gguf_pack.py).

int4 is written as Q4_0 from our own integers (symmetric groups of 32 or a multiple: no second
rounding), an int4 recipe's int8 matrices as Q8_0, int8 as Q8_0 (exact for symmetric integers,
rounded again by llama.cpp's own quantizer otherwise), float16 as F16 (BF16 for a bfloat16
checkpoint), float32 as F32. Norms and biases are F32, as llama.cpp keeps them. The file is
written beside its final name and renamed, so a failed write leaves nothing.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import compressor.backends.llm.gguf_meta as meta
import compressor.backends.llm.gguf_pack as pack
from compressor.backends.llm.gguf_vocab import write_tokenizer
from compressor.decoders.gguf_header import GGUF_CONTEXT_KEY as CONTEXT_KEY
from compressor.backends.llm.model import run_context
from compressor.errors import BackendUnavailableError

# llama.cpp's general.file_type (LLAMA_FTYPE_*): what most of the file's matrices are
FILE_TYPES = {pack.F32: 0, pack.F16: 1, pack.Q4_0: 2, pack.Q4_1: 3, pack.Q8_0: 7, pack.BF16: 32}
# one tensor's stored form: (values or raw bytes, ggml type, how it relates to our integers)
Encoded = tuple[np.ndarray, int, str]


def write_gguf_model(state: Any, scheme: Any, path: Path, ctx: Any) -> Path:
    """The export handler: `state.model` (a LoadedLm) under `scheme` as `path` (model.gguf)."""
    import torch

    loaded = state.model
    storage = scheme.storage
    bits = None if storage is None else storage.linears.bits
    if bits not in (None, 4, 8, 16, 32):
        raise BackendUnavailableError(f"the GGUF route writes float32, float16, int8 or int4 "
                                      f"weights, not {scheme.label}")
    if bits in (4, 8) and not loaded.quantized:
        raise BackendUnavailableError(f"the int{bits} GGUF export needs the quantized weights; "
                                      "run the quantize step first")
    dtype = loaded.model.dtype
    float_type = pack.F32 if scheme.dtype == "float32" else (
        pack.BF16 if dtype == torch.bfloat16 else pack.F16)
    ctx.progress.info(f"export gguf: llama.cpp blocks "
                      f"({'our integers' if loaded.quantized else pack.TYPE_NAMES[float_type]})")
    counts: Counter[str] = Counter()

    def encode(name: str, tensor: Any) -> Encoded:
        weight = loaded.quantized.get(name)
        if weight is not None:
            blocks = pack.as_blocks(weight)
            counts[blocks.how] += 1
            return blocks.data, blocks.ggml_type, blocks.how
        values = tensor.detach().to(torch.float32).numpy()
        kind = float_type if values.ndim >= 2 else pack.F32
        return _float(values, kind), kind, "float"

    path = Path(path)
    write_file(loaded.model, loaded.tokenizer, path, encode, context=run_context(ctx, loaded.config))
    kept = counts.pop("kept", 0)
    if counts:
        ctx.record.add_note("gguf_weights", f"{kept} matrices kept as quantized; " + "; ".join(
            f"{n} {how}" for how, n in counts.items()) + " (backends/llm/gguf_pack.py)")
    return path


def _float(values: np.ndarray, kind: int) -> np.ndarray:
    if kind == pack.F32:
        return values.astype(np.float32)
    if kind == pack.F16:
        return values.astype(np.float16)
    import gguf

    return gguf.quants.quantize(values, gguf.GGMLQuantizationType.BF16)


def write_file(model: Any, tokenizer: Any, path: Path, encode: Callable[[str, Any], Encoded],
               context: int | None = None, name: str | None = None) -> Path:
    """`model`'s tensors as `encode(hf_name, tensor)` stores them, with llama.cpp's names and
    metadata, as `path` (written as path + ".part", then renamed)."""
    import gguf

    config = model.config
    if config.model_type not in meta.ARCHS:
        raise BackendUnavailableError(
            f"the GGUF route does not write {config.model_type} models yet (it writes "
            f"{', '.join(sorted(meta.ARCHS))}); export onnx or tflite")
    why = meta.refusal(config, context)
    if why is not None:
        raise BackendUnavailableError(f"the GGUF route cannot write this model: {why}; "
                                      "export onnx or tflite")
    arch = meta.arch_of(config)
    part = path.with_name(path.name + ".part")
    writer = gguf.GGUFWriter(str(part), arch.name)
    try:
        types = _add_tensors(writer, model, encode)
        file_type = Counter(t for t in types if t not in (pack.F32,)).most_common(1)
        meta.write_hyperparameters(writer, config, name or _model_name(model),
                                   FILE_TYPES.get(file_type[0][0] if file_type else pack.F32, 0),
                                   tokenizer.get_vocab())
        write_tokenizer(writer, tokenizer, int(config.vocab_size))
        if context:
            writer.add_uint32(CONTEXT_KEY, int(context))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        part.replace(path)
    finally:
        part.unlink(missing_ok=True)
    return path


def _add_tensors(writer: Any, model: Any, encode: Callable[[str, Any], Encoded]) -> list[int]:
    import gguf

    config = model.config
    arch, names = meta.arch_of(config), meta.name_map(config)
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    transposed = meta.conv1d_weights(model)
    types = []
    for rope_name, factors in meta.rope_tensors(config).items():
        writer.add_tensor(rope_name, factors)
    for hf_name, tensor in model.state_dict(keep_vars=False).items():
        if hf_name in transposed:   # [in, out] as rows (a quantized weight's blocks are rows)
            tensor = tensor.t()
        # llama.cpp's names of the tensor's pieces (most often one: the tensor itself)
        targets = [meta.tensor_name(names, n) for n, _ in meta.pieces(config, hf_name, tensor)]
        targets = [None if t is None or (tied and t.startswith("output.")) else t
                   for t in targets]
        if not any(targets):
            continue
        data, kind, _ = encode(hf_name, tensor)
        for gguf_name, (_, rows) in zip(targets, meta.pieces(config, hf_name, data)):
            if gguf_name is None:
                continue
            if arch.norm_plus_one and gguf_name.endswith("norm.weight"):
                rows = rows + 1.0
            heads = meta.row_heads(config, gguf_name)
            if heads is not None:
                rows = meta.permute_rows(rows, heads)
            raw = None if kind in (pack.F32, pack.F16) else gguf.GGMLQuantizationType(kind)
            writer.add_tensor(gguf_name, np.ascontiguousarray(rows), raw_dtype=raw)
            types.append(kind)
    return types


def _model_name(model: Any) -> str:
    path = getattr(model.config, "_name_or_path", "") or ""
    return Path(path).name or model.config.model_type

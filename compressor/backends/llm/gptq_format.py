"""Write a LoadedLm with quantized linears as a GPTQ-format Hugging Face folder.

onnxruntime-genai's model builder reads GPTQ checkpoints and re-packs their integers as
MatMulNBits: it unpacks qweight / qzeros, dequantizes with the scales, and rounds back,
which returns exactly our integers (checked on the tiny models, 4 and 8 bits). So this
folder is how our grid (GPTQ, RTN, a GGUF file's own) reaches the ONNX artifact without a
second rounding.

GPTQ layout per linear `<base>` (weight [N out, K in], group g, pack = 32 / bits):
  qweight int32 [K / pack, N]   pack values along K, value j at bit bits * j
  qzeros  int32 [K / g, N / pack] zero - 1 (GPTQ "v1" checkpoints) packed along N
  scales  [K / g, N]             float32 here: the builder keeps them and writes float32
                                 MatMulNBits scales, so the artifact computes with ours
  g_idx   int32 [K]              k // g (no act-order)
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from compressor.backends.llm.model import LoadedLm, QuantizedLinear
from compressor.backends.llm.streamed_safetensors import Lazy
from compressor.errors import BackendUnavailableError

BITS = (4, 8)


def pack_along_rows(values: np.ndarray, bits: int) -> np.ndarray:
    """[R, C] integers 0 .. 2**bits - 1 -> int32 [R / pack, C], value j of each run at bit bits*j."""
    pack = 32 // bits
    rows, cols = values.shape
    grouped = values.reshape(rows // pack, pack, cols).astype(np.uint32)
    out = np.zeros((rows // pack, cols), dtype=np.uint32)
    for j in range(pack):
        out |= grouped[:, j, :] << np.uint32(bits * j)
    return out.view(np.int32)


def gptq_tensors(name: str, weight: QuantizedLinear) -> dict[str, np.ndarray]:
    """The four GPTQ tensors of one quantized linear, named after its weight `name`."""
    return {item.name: item.make().numpy() for item in lazy_gptq_tensors(name, weight)}


def lazy_gptq_tensors(name: str, weight: QuantizedLinear) -> list[Lazy]:
    """gptq_tensors, each made only when written (streamed_safetensors.py)."""
    import torch

    n, k = weight.shape
    bits, group = weight.bits, weight.group_size
    pack = 32 // bits
    if bits not in BITS:
        raise BackendUnavailableError(f"{name}: {bits}-bit weights; the ONNX route writes 4 or 8 bits")
    if k % group or k % pack or n % pack:
        raise BackendUnavailableError(
            f"{name}: shape [{n}, {k}] does not pack as GPTQ (needs in features a multiple of "
            f"group_size {group} and of {pack}, out features a multiple of {pack}); "
            "choose a group_size that divides the layer widths or export tflite")

    def qweight() -> np.ndarray:
        # QuantizedLinear.packed [N, K*bits/8] read as little-endian int32 words is
        # [N, K/pack] with value j of each word at bit bits*j: qweight is its transpose
        return np.ascontiguousarray(weight.packed.numpy().view("<i4").T)

    def qzeros() -> np.ndarray:
        zeros = (weight.zeros.numpy().astype(np.int32) - 1) & ((1 << bits) - 1)   # v1 format
        return np.ascontiguousarray(pack_along_rows(np.ascontiguousarray(zeros), bits).T)

    def scales() -> np.ndarray:
        return np.ascontiguousarray(weight.scales.numpy().astype(np.float32).T)

    base = name[: -len(".weight")]
    parts = ((f"{base}.qweight", torch.int32, (k // pack, n), qweight),
             (f"{base}.qzeros", torch.int32, (k // group, n // pack), qzeros),
             (f"{base}.scales", torch.float32, (k // group, n), scales),
             (f"{base}.g_idx", torch.int32, (k,), lambda: np.arange(k, dtype=np.int32) // group))
    return [Lazy(key, dtype, shape, lambda make=make: torch.from_numpy(make()))
            for key, dtype, shape, make in parts]


def quantization_config(loaded: LoadedLm) -> dict:
    """config.json's quantization_config: the bit width and group size most weights have,
    and for the others (an int4 model's matrices kept at int8, mixed.py) a `dynamic` entry
    each, the per-module override GPTQ checkpoints carry and the builder's GPTQ loader reads
    (a regex on the tensor's name -> bits, group_size)."""
    weights = linear_weights(loaded)
    grids = [(w.bits, w.group_size) for w in weights.values()]
    bits, group = max(set(grids), key=grids.count)
    dynamic = {f"^{re.escape(name.removesuffix('.weight'))}\\.": {"bits": w.bits,
                                                                  "group_size": w.group_size}
               for name, w in weights.items() if (w.bits, w.group_size) != (bits, group)}
    config = {"quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": False,
              "sym": False, "checkpoint_format": "gptq"}
    return {**config, "dynamic": dynamic} if dynamic else config


def write_gptq_folder(loaded: LoadedLm, folder: Path) -> Path:
    """config.json (+ quantization_config), model.safetensors, tokenizer and generation config."""
    from compressor.backends.llm.streamed_safetensors import lazy, save_streamed

    if not loaded.quantized:
        raise BackendUnavailableError("no quantized linears to write as GPTQ (run a quantize step)")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model = loaded.model
    state = model.state_dict()
    params = dict(model.named_parameters(remove_duplicate=False))
    missing = sorted(set(loaded.quantized) - set(params))
    if missing:
        raise BackendUnavailableError(f"quantized weight {missing[0]!r} is not a parameter of the model")
    linears = linear_weights(loaded)
    # streamed: one GPTQ tensor at a time, not a second copy of the model's integers
    tensors = [lazy(name, value) for name, value in state.items()   # the checkpoint's dtype
               if name not in linears and not _is_tied_copy(model, name)]
    for name, weight in linears.items():
        tensors += lazy_gptq_tensors(name, weight)
    save_streamed(tensors, folder / "model.safetensors", metadata={"format": "pt"})

    config = builder_config(model.config.to_dict(), type(model).__name__)
    config["quantization_config"] = quantization_config(loaded)
    (folder / "config.json").write_text(json.dumps(config, indent=2, default=str))
    save_tokenizer_and_generation(loaded, folder)
    return folder


def builder_config(config: dict, architecture: str) -> dict:
    """The config.json the builder reads (`config`: transformers' `to_dict()` of the model's
    config, so the Hub's original and transformers 5's forms arrive alike).

    RoPE given per layer type (transformers 5 keeps Gemma 3's as {"full_attention": {...},
    "sliding_attention": {...}} whichever form config.json had): the builder 0.18 reads
    `rope_parameters["rope_type"]` (KeyError 'rope_type') and Gemma 3's `rope_local_base_freq`.
    The global layers' parameters go beside the per-type ones too (transformers validates
    only the per-type entries, and reads those), with the sliding layers' theta as
    `rope_local_base_freq`; the builder lifts every key of `rope_parameters` onto its config."""
    config = {**config, "architectures": [architecture]}
    rope = config.get("rope_parameters")
    per_type = {key: value for key, value in (rope or {}).items()
                if key in set(config.get("layer_types") or ()) and isinstance(value, dict)}
    if per_type and "rope_type" not in rope:
        full = per_type.get("full_attention") or next(iter(per_type.values()))
        flat = {**rope, **full}
        if "sliding_attention" in per_type and "rope_theta" in per_type["sliding_attention"]:
            flat["rope_local_base_freq"] = per_type["sliding_attention"]["rope_theta"]
        config["rope_parameters"] = flat
    return config


def linear_weights(loaded: LoadedLm) -> dict[str, QuantizedLinear]:
    """The quantized weights GPTQ stores, by the name the builder reads: the lm_head's matrix
    as "<head module>.weight" even when a tied model's quantize step keyed it by the embedding
    name; an untied input embedding left out (the builder takes it in float only; genai_graph.py
    puts our integers back after it)."""
    model = loaded.model
    params = dict(model.named_parameters(remove_duplicate=False))
    head = model.get_output_embeddings()
    head_name = next(name for name, module in model.named_modules(remove_duplicate=False)
                     if module is head) + ".weight"
    embedding = model.get_input_embeddings().weight
    out = {}
    for name, weight in loaded.quantized.items():
        param = params.get(name)
        if param is head.weight:
            out[head_name] = weight
        elif param is not embedding:
            out[name] = weight
    return out


def input_embedding_name(model) -> str:
    weight = model.get_input_embeddings().weight
    return next((name for name, p in model.named_parameters(remove_duplicate=False)
                 if p is weight), "model.embed_tokens.weight")


def save_tokenizer_and_generation(loaded: LoadedLm, folder: Path) -> None:
    if loaded.tokenizer is None:
        raise BackendUnavailableError("the model has no tokenizer; the ONNX route needs its "
                                      "tokenizer files (load a folder with tokenizer.json)")
    loaded.tokenizer.save_pretrained(str(folder))
    generation = getattr(loaded.model, "generation_config", None)
    if generation is not None:
        generation.save_pretrained(str(folder))


def _is_tied_copy(model, name: str) -> bool:
    """lm_head.weight of a tied model is the embedding table: save_pretrained drops it too."""
    return name == "lm_head.weight" and bool(getattr(model.config, "tie_word_embeddings", False))

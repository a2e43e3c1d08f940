"""A `.gguf` file (llama.cpp's format) as a LoadedLm, its Q4_0 blocks kept as they are.

transformers reads the file (config, tokenizer, weights) and dequantizes it tensor by tensor
straight into the model's dtype, so no float32 copy of the whole model is ever held. The
dtype is the file's own float type: bfloat16 if it holds BF16 tensors, float32 if it holds
only F32 ones (as an fp32 Hugging Face folder loads in fp32), float16 otherwise (the scales of
Q4_0 / Q4_1 / Q8_0 / K-quant blocks are fp16). The tokenizer is rebuilt from the file's
`tokenizer.ggml.*` metadata. Everything stays in memory (`source` is None): nothing is
written next to the file or in a temporary folder.

Q4_0 linear weights (blocks of 32 inputs) also come back as QuantizedLinear (4 bits, group
32, scale d, zero point 8: exact) in `LoadedLm.file_grids`, read from the raw blocks, so an
`int4` recipe at group size 32 keeps the file's grid instead of rounding a second time
(`LoadedLm.grids_on`). Q4_1 (w = d * q + m) has a real zero point -m / d that our grid (uint8
zero points) cannot carry. Measured on tiny Llamas trained on the built-in text (4 layers,
hidden 128 / 256, 32 held-out windows of 128 tokens, output KL divergence from the Q4_1
file's own model): rounding the zero point (gguf_blocks.q41_on_int_grid, scale refit by
least squares) moves the weights by 7.9% of their rms (as much as Q4_1's own rounding,
7.8%), KL 1.2e-3 / 8.7e-4 nats per token, top-1 agreement 96.1% / 96.9%; quantizing those
tensors again with GPTQ from the file's values gives KL 7.5e-4 / 2.1e-4, agreement 96.9% /
98.8% (perplexity within +-0.2% of the file's for both). So by default Q4_1 tensors are
left to the recipe (its algorithm starts from the file's values as loaded, in float16);
`keep_q4_1=True` keeps the rounded grids instead. Every other type (Q5_0 / Q5_1, Q8_0, the
K-quants, F16, BF16, F32) is only dequantized, and an integer recipe quantizes it as usual
(gguf_types.py: which types load, why no other grid is kept, the one-line refusal of a type
no Python dequantizer reads); the notes (report.json `notes`) say per type how many weights
were kept and how many dequantized. Each kept grid is checked against the weight
transformers loaded (bit for bit, in the model's dtype, on sampled rows), so a name or
row-order mistake drops the grid (noted) instead of corrupting the model.

Memory (a 91M-parameter Llama, Q4_0 file): the fp16 model plus the grids added 1.95x the bf16
checkpoint size to the process's RSS when grids held 1 byte per weight; they are packed now
(0.5 byte per weight + scales). The dequantized model is not memory-mapped, so its float
weights stay resident after quantization (a folder's are handed back, quantize.py).
"""
from __future__ import annotations

import contextlib
import io
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from compressor.backends.llm.gguf_types import (BF16, F32, FLOATS, Q4_0, Q4_1, Tally,
                                                 refuse_unreadable, unknown_type)
from compressor.backends.llm.model import LoadedLm, QuantizedLinear
from compressor.decoders.families import gguf_loadable_architectures
from compressor.errors import BackendUnavailableError, ModelLoadError, first_line

MAGIC = b"GGUF"
# general.architecture values read here: the families registered with gguf_loads
# (decoders/families.py), which transformers loads from GGUF and whose linear tensor names are
# the standard blk.N.* ones mapped below. llama.cpp writes Mistral models as `llama` (they load
# as LlamaForCausalLM: the same computation).
ROW_PERMUTED = ("llama",)   # llama.cpp permutes attn_q / attn_k rows for these (rotary pairs)
_LINEAR_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_NAME = re.compile(r"^blk\.(\d+)\.(\w+)\.weight$")
# metadata transformers 5.24 does not map to the config (it would keep the class default:
# Qwen3Config's head_dim 128, right for released Qwen3 models, wrong for others)
_MISSED_CONFIG = {"qwen3": {"attention.key_length": "head_dim"}}


def load_gguf(path: str | Path, dtype: Any = None, keep_q4_1: bool = False) -> LoadedLm:
    """The model in `path` (float16 / bfloat16 / the file's float type; `dtype` overrides),
    its tokenizer, and its Q4_0 linear weights as QuantizedLinear; `keep_q4_1`: its Q4_1
    ones too, zero points rounded (by default the recipe quantizes them again)."""
    path = Path(path)
    reader = _open_reader(path)
    architecture = _architecture(reader, path)
    refuse_unreadable(reader, path)
    dtype = dtype or model_dtype(reader)
    model = _load_model(path, dtype, _missed_config(reader, architecture))
    tokenizer = _load_tokenizer(path)
    grids, notes = file_grids(reader, model, architecture, keep_q4_1)
    return LoadedLm(model=model, tokenizer=tokenizer, source=None, file_grids=grids,
                    notes=notes)


def model_dtype(reader: Any) -> Any:
    import torch

    types = {int(tensor.tensor_type) for tensor in reader.tensors}
    if BF16 in types:
        return torch.bfloat16
    return torch.float32 if types <= {F32} else torch.float16


def _open_reader(path: Path) -> Any:
    if not path.is_file():
        raise ModelLoadError(f"model {path} does not exist; check the path")
    with open(path, "rb") as file:
        head = file.read(4)
    if head != MAGIC:
        raise ModelLoadError(f"{path} is not a GGUF file (it does not start with the GGUF "
                             "magic bytes); give a .gguf written by llama.cpp or a Hugging "
                             "Face model folder")
    try:
        from gguf import GGUFReader
    except ImportError:
        raise BackendUnavailableError("reading .gguf files needs the gguf package, which is "
                                      "not installed; pip install 'compressor[llm]' (or pip "
                                      "install gguf==0.19.0)") from None
    try:
        return GGUFReader(path)
    except (ValueError, IndexError, KeyError, OSError) as exc:
        refusal = unknown_type(exc, path) if isinstance(exc, ValueError) else None
        if refusal is not None:
            raise refusal from None
        raise ModelLoadError(f"{path} is a corrupt or truncated GGUF file "
                             f"({first_line(exc, 120)}); download or convert it again") from None


def _architecture(reader: Any, path: Path) -> str:
    field = reader.fields.get("general.architecture")
    architecture = field.contents() if field is not None else None
    loadable = gguf_loadable_architectures()
    if architecture not in loadable:
        raise ModelLoadError(f"{path}: GGUF architecture {architecture!r} is not supported "
                             f"(supported: {', '.join(loadable)}); convert the model to "
                             "a Hugging Face folder and give that")
    return architecture


def _missed_config(reader: Any, architecture: str) -> dict[str, Any]:
    found = {}
    for key, attribute in _MISSED_CONFIG.get(architecture, {}).items():
        field = reader.fields.get(f"{architecture}.{key}")
        if field is not None:
            found[attribute] = field.contents()
    return found


def _load_model(path: Path, dtype: Any, config: dict[str, Any]) -> Any:
    import transformers
    from transformers.utils.quantization_config import GgufConfig

    try:
        with _quiet_transformers():
            # dequantize=True: plain nn.Linear weights in `dtype`, never GgufLinear blocks
            model = transformers.AutoModelForCausalLM.from_pretrained(
                path.parent, gguf_file=path.name, dtype=dtype,
                quantization_config=GgufConfig(dequantize=True), **config)
    except (ValueError, KeyError, OSError, RuntimeError, NotImplementedError) as exc:
        raise ModelLoadError(f"cannot load the model in {path}: {first_line(exc)}") from None
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:   # the model is a plain dense one now: let it save normally
        quantizer.remove_quantization_config(model)
    return model.eval()


def _load_tokenizer(path: Path) -> Any:
    import transformers

    try:
        with _quiet_transformers():
            return transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except (ValueError, KeyError, OSError, TypeError) as exc:
        raise ModelLoadError(f"{path} has no usable tokenizer (tokenizer.ggml.* metadata): "
                             f"{first_line(exc)}; convert the model with its tokenizer") from None


def file_grids(reader: Any, model: Any, architecture: str, keep_q4_1: bool = False
               ) -> tuple[dict[str, QuantizedLinear], tuple[str, ...]]:
    """Parameter name -> QuantizedLinear for the file's Q4_0 (and with `keep_q4_1`, Q4_1)
    linear weights that transformers loaded into `model`, and notes on what was done with
    each quantized type (kept, or dequantized for the recipe to quantize again)."""
    import compressor.backends.llm.gguf_blocks as blocks
    from compressor.backends.llm.quantize import quantized_weight_names

    params = dict(model.named_parameters(remove_duplicate=False))
    # the names the quantize pass uses (a tied lm_head is named as the embedding it shares)
    canonical = {id(params[name]): name for name in quantized_weight_names(model)}
    quantized: dict[str, QuantizedLinear] = {}
    tally = Tally()
    for tensor in reader.tensors:
        ggml_type = int(tensor.tensor_type)
        name = _param_name(tensor.name)
        if ggml_type in FLOATS or name not in params or id(params[name]) not in canonical:
            continue
        if ggml_type not in (Q4_0, Q4_1) or (ggml_type == Q4_1 and not keep_q4_1):
            tally.dequantized[ggml_type] += 1
            continue
        weight = params[name]
        order = _row_order(tensor.name, architecture, model.config, tensor.data.shape[0])
        codes, d, m = blocks.unpack_blocks(tensor.data, ggml_type, order)
        if not blocks.matches(codes, d, m, weight):
            tally.dropped.append(tensor.name)
            continue
        grid = blocks.q40_grid(codes, d) if m is None else blocks.q41_on_int_grid(codes, d, m)
        quantized[canonical[id(weight)]] = grid
        tally.kept[ggml_type] += 1
    return quantized, tally.notes()


def _param_name(gguf_name: str) -> str | None:
    """transformers' parameter name for a GGUF tensor name (standard decoder layout)."""
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output.weight":
        return "lm_head.weight"
    match = _BLOCK_NAME.match(gguf_name)
    if match and match.group(2) in _LINEAR_NAMES:
        return f"model.layers.{match.group(1)}.{_LINEAR_NAMES[match.group(2)]}.weight"
    return None


def _row_order(gguf_name: str, architecture: str, config: Any, rows: int) -> Any:
    """The row index undoing llama.cpp's q/k permutation, or None where there is none."""
    from compressor.backends.llm.gguf_blocks import unpermute_rows

    if architecture not in ROW_PERMUTED:
        return None
    if ".attn_q." in gguf_name:
        return unpermute_rows(rows, config.num_attention_heads)
    if ".attn_k." in gguf_name:
        return unpermute_rows(rows, config.num_key_value_heads)
    return None


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' GGUF loader prints progress bars and a warning about packed float32
    kernels that does not apply to a dequantized load: keep them off the user's terminal."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)

"""The TFLite route of a causal LM: model.tflite with prefill_<T> / decode signatures and a KV
cache sized to the run's context, traced by litert-torch's export_hf route from the
transformers model itself (litert_convert.py, in a child process), then given compressor's
own integers (litert_weights.py / litert_grid.py) instead of a second rounding by a quantizer.

The float model is traced from a float32 checkpoint of exactly the weights the artifact
computes with (dequantized integers; a tied embedding = the lm_head's dequantized matrix), so
each weight buffer in the .tflite is found by its content and replaced by its integers. The
tokenizer files go into the file's metadata table, so the .tflite alone can generate text.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from compressor.backends.llm.model import run_context
from compressor.errors import BackendUnavailableError

PREFILL_MAX = 512               # prefill signature length: min(this, context)
BITS = (32, 16, 8, 4)            # the widths a scheme's storage may give (decoders/storage.py)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
LAST_RUN: dict[str, Any] = {}   # the last conversion's seconds / peak RSS (tests, bench)
# RoPE that depends on the sequence length at run time: a traced graph fixes one branch
LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")
# attention heads as transformers names them, and as config.json files name them where the
# config class maps the name (GPT-2's n_head): check_family also reads raw config.json files
HEADS_KEYS = ("num_attention_heads", "n_head", "n_heads", "num_heads")


def write_litert_model(state: Any, scheme: Any, path: Path, ctx: Any) -> Path:
    """Write staging/model.tflite for `scheme` (float32, float16, int8, int4); returns it."""
    import compressor.backends.llm.litert_weights as litert_weights

    storage = scheme.storage
    loaded, bits = state.model, None if storage is None else storage.linears.bits
    if bits not in BITS:
        raise BackendUnavailableError(f"the TFLite route writes float32, float16, int8 or int4 "
                                      f"weights, not {scheme.dtype}")
    _check_quantized(loaded, bits)
    check_family(loaded.config)
    context = run_context(ctx, loaded.config)
    prefill = [min(PREFILL_MAX, context)]
    work = Path(ctx.workdir) / "litert"
    shutil.rmtree(work, ignore_errors=True)
    ctx.progress.info(f"export tflite: litert-torch (export_hf), context {context}, prefill "
                      f"{prefill[0]}, {scheme.dtype} weights")
    digests = write_float_folder(loaded, work / "hf")
    float_path = convert(work / "hf", work / "float.tflite", prefill, context,
                         Path(ctx.workdir) / "logs" / "litert_convert.log")
    model = litert_weights.read(float_path)
    if bits == 16:
        litert_weights.store_float16(model)
    elif bits in (8, 4):
        _store_integers(model, loaded, digests, ctx)
    litert_weights.add_metadata(model, _metadata(loaded, context, prefill))
    litert_weights.write(model, path)
    shutil.rmtree(work, ignore_errors=True)
    return Path(path)



def check_family(config: Any) -> None:
    """Refuse, before converting, what litert-torch's export_hf cannot trace correctly:
    models without attention layers (state-space models: no KV cache to export) and RoPE
    that changes with the sequence length. `config`: a transformers config, or config.json
    read as attributes."""
    family = getattr(config, "model_type", "?")
    text = getattr(config, "text_config", None) or config
    if not any(getattr(text, key, None) for key in HEADS_KEYS):
        raise BackendUnavailableError(f"the TFLite route exports attention KV caches; {family} "
                                      "has no attention layers; export onnx instead")
    rope = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    settings = [rope, *(v for v in rope.values() if isinstance(v, dict))] \
        if isinstance(rope, dict) else []   # gemma3: one set per attention type
    kinds = {s.get("rope_type", s.get("type")) for s in settings}
    kind = next((k for k in kinds if k in LENGTH_DEPENDENT_ROPE), None)
    if kind:
        raise BackendUnavailableError(f"the TFLite route cannot export {kind} RoPE ({family}): "
                                      "its frequencies change with the sequence length; export "
                                      "onnx instead")


def _check_quantized(loaded: Any, bits: int) -> None:
    if bits >= 16 and loaded.quantized:
        raise BackendUnavailableError(f"a float{bits} export of a quantized model would lose "
                                      "its integers; export int4 / int8 instead")
    if bits <= 8:
        found = {w.bits for w in loaded.quantized.values()}
        if bits not in found or not found <= {bits, 8}:   # int4: some matrices may be int8
            raise BackendUnavailableError(
                f"the int{bits} TFLite export needs the quantized weights at {bits} bits (got "
                f"{sorted(found) or 'none'}); run the quantize step first")


def write_float_folder(loaded: Any, folder: Path) -> dict[bytes, str]:
    """config.json + model.safetensors (float32) of the weights the artifact computes with;
    returns digest of each quantized matrix's float32 bytes [N, K] (what a FULLY_CONNECTED
    holds) -> its key (`matrix_keys`). Written one tensor at a time: never a float32 copy of
    the whole model in memory."""
    import torch

    from compressor.backends.llm.litert_weights import digest
    from compressor.backends.llm.streamed_safetensors import Lazy, save_streamed

    model = loaded.model
    params = dict(model.named_parameters(remove_duplicate=False))
    quantized_of = {id(params[name]): name for name in loaded.quantized if name in params}
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    digests: dict[bytes, str] = {}

    def float32(value: Any, source: str | None):
        def make():
            if source is None:
                return value.detach().to(torch.float32)
            for key, matrix in matrix_keys(source, loaded.quantized[source]):
                digests[digest(matrix.dequantize().numpy())] = key
            return loaded.quantized[source].parameter().to(torch.float32)
        return make

    tensors = []
    for name, value in model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue                   # the embedding table; transformers ties it on load
        source = quantized_of.get(id(params[name])) if name in params else None
        tensors.append(Lazy(name, torch.float32, tuple(value.shape), float32(value, source)))
    folder.mkdir(parents=True, exist_ok=True)
    save_streamed(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    model.config.save_pretrained(str(folder))
    return digests


def matrix_keys(name: str, weight: Any) -> list[tuple[str, Any]]:
    """(key, [N, K] QuantizedLinear) per matrix of a quantized weight: its name, or
    "name[e]" per expert of stacked experts (the converter gives each its own constant)."""
    single = weight.experts is None
    return [(name if single else f"{name}[{e}]", matrix)
            for e, matrix in enumerate(weight.matrices())]


def convert(folder: Path, out: Path, prefill: list[int], context: int, log: Path) -> Path:
    """The float .tflite, traced in a child process (litert_convert.py); its output to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "compressor.backends.llm.litert_convert", str(folder),
               str(out), "--prefill", ",".join(map(str, prefill)), "--context", str(context)]
    start = time.perf_counter()
    with open(log, "a", encoding="utf-8", errors="replace") as sink:
        sink.write(f"=== {' '.join(command)}\n")
        sink.flush()
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=sink, text=True,
                              check=False)
        sink.write(done.stdout)         # litert-torch's progress lines
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines or not out.is_file():
        reason = (f"the converter was killed by signal {-done.returncode} (out of memory?)"
                  if done.returncode < 0 else _last_line(log))
        raise BackendUnavailableError(f"litert-torch could not convert this model: {reason} "
                                      f"(log: {log}); export onnx instead")
    LAST_RUN.clear()
    LAST_RUN.update(json.loads(lines[-1]), wall_seconds=round(time.perf_counter() - start, 2))
    return out


def _last_line(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    reasons = [line for line in lines if line.startswith("litert-torch cannot convert")] or \
        [line for line in lines if "Error" in line.split(":")[0]] or lines or ["no output"]
    return reasons[-1][:200]


def _store_integers(model: Any, loaded: Any, digests: dict[bytes, str], ctx: Any) -> None:
    from compressor.backends.llm.litert_grid import ROUNDED_AGAIN, SCALES_ROUNDED, on_litert_grid
    from compressor.backends.llm.litert_weights import store_integers

    matrices = dict(pair for name, weight in loaded.quantized.items()
                    for pair in matrix_keys(name, weight))
    grids, how = {}, {}
    for key, name in digests.items():
        grids[key], how[name] = on_litert_grid(matrices[name])

    def dequantized(key: bytes):
        return matrices[digests[key]].dequantize().numpy()

    found = store_integers(model, grids, dequantized)
    missing = sorted(digests[key] for key in set(digests) - set(found))
    copies = sorted(digests[key] for key, count in found.items() if count > 1)
    again = sorted(name for name, status in how.items() if status == ROUNDED_AGAIN)
    scaled = sorted(name for name, status in how.items() if status == SCALES_ROUNDED)
    if again:
        ctx.progress.info(f"export tflite: {len(again)} of {len(digests)} weights are not on a "
                          "grid LiteRT computes with (symmetric; int8 per channel; int4 per "
                          "channel or block 32-256): rounded again to nearest on LiteRT's grid")
    if scaled:
        ctx.progress.info(f"export tflite: {len(scaled)} weights keep their integers, but "
                          "LiteRT computes their block scales in bfloat16")
    if missing:
        ctx.progress.info(f"export tflite: {len(missing)} quantized weights stay float32 (the "
                          f"converter changed them): {', '.join(missing[:3])}")
    if copies:
        ctx.progress.info(f"export tflite: the converter folded a constant into {copies[0]}'s "
                          "use as lm_head: the file holds its integers twice")
    ctx.record.add_note("tflite_weights", {
        "as_quantized": sum(how[digests[key]] != ROUNDED_AGAIN for key in found),
        "scales_rounded_to_bf16": scaled, "rounded_again": again, "left_float": missing,
        "stored_twice": copies})


def _metadata(loaded: Any, context: int, prefill: list[int]) -> dict[str, bytes]:
    """The tokenizer files and what generating needs, under compressor.* names."""
    import tempfile

    entries = {}
    tokenizer = loaded.tokenizer
    if tokenizer is not None:
        with tempfile.TemporaryDirectory() as folder:
            tokenizer.save_pretrained(folder)
            for name in TOKENIZER_FILES:
                if (Path(folder) / name).is_file():
                    entries[f"compressor.{name}"] = (Path(folder) / name).read_bytes()
    config = loaded.config
    facts = {"model_type": config.model_type, "context": context, "prefill_lengths": prefill,
             "vocab_size": config.vocab_size,
             **{key: getattr(tokenizer, key, None) for key in
                ("bos_token_id", "eos_token_id", "pad_token_id")}}
    entries["compressor.lm.json"] = json.dumps(facts).encode()
    return entries

"""The ONNX route of a causal LM: the folder onnxruntime-genai opens (model-onnx/), written by
onnxruntime-genai's own model builder, in this process (genai_builder.py).

int4 / int8: our integers go in as a GPTQ-format checkpoint (gptq_format.py), which the
builder re-packs as MatMulNBits without rounding again (genai_repack.py does that re-pack,
byte-identical and faster); float32: the float HF folder at -p fp32; float16: the same with
the weights stored as float16 (genai_fp16.py: the builder's CPU float16 graph cannot
generate). Afterwards (genai_graph.py) the embedding reads our integers too, the rotary
tables and the KV cache are sized to the run's context (genai_config.json).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from compressor.backends.llm.genai_builder import run_builder
from compressor.backends.llm.genai_checks import onnx_route_refusal
from compressor.backends.llm.gptq_format import (builder_config, save_tokenizer_and_generation,
                                                  write_gptq_folder)
from compressor.backends.llm.model import run_context
from compressor.errors import BackendUnavailableError
from compressor.core.memory import trim_heap

FOLDER = "model-onnx"
# The builder's precision per stored width (the scheme's storage, decoders/storage.py): our
# integers go in at -p int4 whatever their bits (at -p int8 a tied embedding would be a float
# copy); float16 is built at fp32 (genai_fp16.py).
PRECISIONS = {32: "fp32", 16: "fp32", 8: "int4", 4: "int4"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def write_genai_folder(state: Any, scheme: Any, path: Path, ctx: Any) -> Path:
    """Write staging/model-onnx (model.onnx + model.onnx.data + genai_config.json + tokenizer
    files) for `scheme` and return the folder. What the route cannot take is refused first,
    from the config alone (genai_checks.py), before the builder runs."""
    from compressor.backends.llm.genai_graph import finish_graph

    loaded = state.model
    refusal = onnx_route_refusal(builder_config(loaded.model.config.to_dict(),
                                                type(loaded.model).__name__))
    if refusal:
        raise BackendUnavailableError(refusal)
    dtype, storage = scheme.dtype, scheme.storage
    bits = None if storage is None else storage.linears.bits
    if bits not in PRECISIONS:
        raise BackendUnavailableError(f"the ONNX route writes float32, float16, int8 or int4 "
                                      f"weights, not {dtype}")
    out = Path(path).parent / FOLDER
    shutil.rmtree(out, ignore_errors=True)
    work = Path(ctx.workdir) / "genai"
    shutil.rmtree(work, ignore_errors=True)
    source = _builder_input(loaded, bits, work / "hf")
    ctx.progress.info(f"export onnx: onnxruntime-genai model builder, {dtype} "
                      f"({'our integers' if loaded.quantized else 'float weights'})")
    run_builder(source, out, PRECISIONS[bits], work / "cache",
                Path(ctx.workdir) / "logs" / "genai_builder.log", _extra_options(loaded.config),
                architecture=type(loaded.model).__name__)
    context = run_context(ctx, loaded.config)
    finish_graph(out / "model.onnx", loaded, context)
    trim_heap()   # the graph edits' freed buffers, before the artifact is evaluated
    if bits == 16:
        from compressor.backends.llm.genai_fp16 import halve_float_weights

        halve_float_weights(out / "model.onnx")
    set_context(out, context)
    _check_tokenizer(out, source)
    _readable(out)
    shutil.rmtree(work, ignore_errors=True)
    return out


def _builder_input(loaded: Any, bits: int, folder: Path) -> Path:
    """The HF folder the builder reads: GPTQ-format for integers, else the float model."""
    if bits < 16:
        found = {w.bits for w in loaded.quantized.values()}
        if bits not in found or not found <= {bits, 8}:   # int4: some matrices may be int8
            raise BackendUnavailableError(
                f"the int{bits} ONNX export needs the quantized weights at {bits} bits "
                f"(got {sorted(found) or 'none'}); run the quantize step first")
        return write_gptq_folder(loaded, folder)
    if loaded.quantized:
        raise BackendUnavailableError(f"a float{bits} export of a quantized model: its integers "
                                      "would be lost; export int4 / int8 instead")
    source = loaded.source
    config = loaded.model.config.to_dict()
    wanted = builder_config(config, type(loaded.model).__name__)
    folder.mkdir(parents=True, exist_ok=True)
    if source is not None and Path(source).is_dir() and any(Path(source).glob("*.safetensors")):
        if wanted.get("rope_parameters") == config.get("rope_parameters"):
            return Path(source)   # the checkpoint as it is: nothing to write
        for item in Path(source).iterdir():   # its files, with the config the builder reads
            if item.name != "config.json":
                (folder / item.name).symlink_to(item.resolve())
    else:
        loaded.model.save_pretrained(str(folder))
        save_tokenizer_and_generation(loaded, folder)
    (folder / "config.json").write_text(json.dumps(wanted, indent=2, default=str))
    return folder


def _extra_options(config: Any) -> tuple[str, ...]:
    """Sliding-window layers (Gemma 2/3, Mistral with a window) get a full-length KV cache:
    the windowed one refuses the empty past that teacher-forced evaluation runs with
    ("KV cache capacity (0) must be at least local_window_size"). Attention still masks to
    the window."""
    return ("windowed_kv_cache=false",) if getattr(config, "sliding_window", None) else ()



def set_context(folder: Path, context: int) -> None:
    """genai_config.json context_length and search.max_length: the KV cache onnxruntime-genai
    allocates (past_present_share_buffer) is this long."""
    path = Path(folder) / "genai_config.json"
    config = json.loads(path.read_text())
    config["model"]["context_length"] = context
    config["search"]["max_length"] = context
    path.write_text(json.dumps(config, indent=4))


def _readable(folder: Path) -> None:
    """The builder writes model.onnx.data owner-only (0600): give it the umask's permissions."""
    umask = os.umask(0)
    os.umask(umask)
    for path in folder.iterdir():
        path.chmod(0o666 & ~umask)


def _check_tokenizer(out: Path, source: Path) -> None:
    """The builder copies the tokenizer files; a folder without them cannot generate text."""
    for name in TOKENIZER_FILES:
        if not (out / name).is_file() and (Path(source) / name).is_file():
            shutil.copy2(Path(source) / name, out / name)
    if not (out / "tokenizer.json").is_file():
        raise BackendUnavailableError("the model's tokenizer has no tokenizer.json (a fast "
                                      "tokenizer); onnxruntime-genai needs one to generate")

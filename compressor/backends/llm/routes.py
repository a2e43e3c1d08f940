"""Which formats compressor can write a language model to, decided from its config.json before
any work: a route the family lacks (decoders/families.py `missing_routes`) or a config one
route's runtime cannot run (each route's own check) is refused in one line that names the
route that works, instead of failing after minutes of reference and quantization work.

A format the user asked for by name that cannot be written is an error; one that only came
from the recipe's `export` list is dropped with a note while another format remains.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from compressor.decoders.families import find_family, missing_route
from compressor.decoders.shapes import text_config
from compressor.errors import BackendUnavailableError, CompressorError
from compressor.formats import format_names


def _litert_refusal(config: dict) -> str | None:
    from compressor.backends.llm.litert import check_family

    try:
        check_family(_namespace(config))
    except BackendUnavailableError as exc:
        return str(exc)
    return None


def _onnx_refusal(config: dict) -> str | None:
    from compressor.backends.llm.genai_checks import onnx_route_refusal

    return onnx_route_refusal(config)


def _gguf_refusal(config: dict) -> str | None:
    """What llama.cpp cannot run whatever the context (a window shorter than the run's
    context is refused when writing, where the context is known)."""
    from compressor.backends.llm.gguf_meta import ARCHS, refusal

    text = _namespace(config)
    text = getattr(text, "text_config", None) or text
    model_type = getattr(text, "model_type", "")
    if model_type not in ARCHS:
        return (f"the GGUF route does not write {model_type or 'this'} models (it writes "
                f"{', '.join(sorted(ARCHS))})")
    return refusal(text, 1)   # context 1: a window is judged when writing, at the run's context


# each route's own check of a config (None: it can convert it)
ROUTE_CHECKS: dict[str, Callable[[dict], str | None]] = {"tflite": _litert_refusal,
                                                          "onnx": _onnx_refusal,
                                                          "gguf": _gguf_refusal}


def _namespace(config: dict) -> SimpleNamespace:
    """A config dict read as the attribute-style transformers config the checks take."""
    return SimpleNamespace(**{k: _namespace(v) if k == "text_config" and isinstance(v, dict)
                              else v for k, v in config.items()})


def refusals(config: dict, formats: tuple[str, ...]) -> dict[str, str]:
    """format -> why it cannot be written for this config, for each of `formats` that cannot."""
    family = find_family(str(text_config(config).get("model_type", "")))
    found = {}
    for fmt in formats:
        check = ROUTE_CHECKS.get(fmt)
        reason = missing_route(family, fmt) or (check(config) if check else None)
        if reason:
            found[fmt] = reason
    return found


def writable_formats(config: dict, formats: tuple[str, ...], explicit: bool
                     ) -> tuple[tuple[str, ...], str | None]:
    """(the formats to write, a note on those dropped). Raises BackendUnavailableError (exit 2)
    when an explicitly asked-for format, or every format, cannot be written."""
    every = refusals(config, tuple(format_names()))
    refused = {fmt: every[fmt] for fmt in formats if fmt in every}
    if not refused:
        return formats, None
    kept = tuple(f for f in formats if f not in refused)
    others = [f for f in format_names() if f not in every]
    if explicit or not kept:
        fmt, reason = next(iter(refused.items()))
        fix = (f"; use --format {','.join(others)}" if others and
               not any(o in reason for o in others) else "")
        raise BackendUnavailableError(f"--format {fmt}: {reason}{fix}")
    return kept, "; ".join(f"export: {fmt} skipped: {why}" for fmt, why in refused.items())


def config_of(model_ref: Any) -> dict | None:
    """config.json of a model given as a path (a folder, its config.json, a .gguf file), read
    without loading weights; None for anything else (module:function, an in-memory model:
    checked once loaded)."""
    if not isinstance(model_ref, (str, Path)):
        return None
    path = Path(model_ref)
    try:
        if path.is_dir() and (path / "config.json").is_file():
            return json.loads((path / "config.json").read_text())
        if path.is_file() and path.name == "config.json":
            return json.loads(path.read_text())
        if path.is_file() and path.suffix == ".gguf":
            from compressor.decoders.gguf_header import gguf_config

            return gguf_config(path)[0]
    except (OSError, ValueError, CompressorError):
        return None   # the loader says what is wrong with the file
    return None

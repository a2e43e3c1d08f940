"""The artifact formats, one registry: what a format is called (recipes' `export`, --format),
the file it is written to, the runtime a device must have for it, and where its runtimes and
inspector live (lazy "module:attribute" references, so nothing is imported until a file of
that format is opened).

Everything that lists, checks or dispatches on formats reads this registry: recipe
validation, export, the handler table's house order, opening and inspecting artifacts for
both tasks, device profiles and the CLI. Adding a format is one `register_format(...)` (the
built-in ones: builtin.py), a runtime / inspector module and its export handlers
(compressor/schemes/handlers.py `export_handler`). It sits right above errors: every layer
may read it.
"""
from __future__ import annotations

from compressor.formats.registry import (FORMAT_NAMES, FORMAT_RUNTIMES, Format, artifact_format,
                                         artifact_only_suffixes, artifact_suffixes,
                                         default_formats, format_named,
                                         format_names, format_of, register_format,
                                         registered_formats, resolve, unregister_format)
from compressor.formats import builtin  # noqa: F401  (registers tflite, onnx and gguf)

__all__ = ["FORMAT_NAMES", "FORMAT_RUNTIMES", "Format", "artifact_format",
           "artifact_only_suffixes", "artifact_suffixes",
           "default_formats", "format_named", "format_names", "format_of", "register_format",
           "registered_formats", "resolve", "unregister_format"]

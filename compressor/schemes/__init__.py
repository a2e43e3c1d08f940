"""Quantization schemes (typed configs) and the handlers each model kind registers for them.

Adding a scheme: a Scheme subclass registered with `register_scheme` (its `name` is the
recipe's quantize `mode`, its `key` fields the step's keys, its `storage` how a language
model's weights are stored) plus `apply_handler` / `export_handler` registrations for the
model kinds and formats it supports (a subclass of a built-in scheme inherits its handlers).
See docs/architecture.md.
"""
from compressor.schemes.base import (Scheme, key, quantize_modes, register_scheme,
                                     registered_schemes, scheme_class, scheme_of_step)
from compressor.schemes.builtin import (FLOAT32, Float16, Float32, Int4Qat, Int4WeightOnly,
                                        Int8Dynamic,
                                        Int8Qat, Int8Scheme, Int8Static, Int8WeightOnly)
from compressor.schemes.handlers import (ExportHandler, apply_handler, apply_scheme, export_handler,
                                         find_apply, find_export, formats_of)

__all__ = ["FLOAT32", "ExportHandler", "Float16", "Float32", "Int4Qat", "Int4WeightOnly",
           "Int8Dynamic",
           "Int8Qat", "Int8Scheme", "Int8Static", "Int8WeightOnly", "Scheme", "apply_handler", "apply_scheme",
           "export_handler", "find_apply", "find_export", "formats_of", "key", "quantize_modes",
           "register_scheme", "registered_schemes", "scheme_class", "scheme_of_step"]

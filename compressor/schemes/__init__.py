"""Quantization schemes (typed configs) and the handlers each model kind registers for them.

Adding a scheme: a Scheme subclass registered with `register_scheme` (its `name` is the
recipe's quantize `mode`) plus `apply_handler` / `export_handler` registrations for the
model kinds and formats it supports. See README "Adding a scheme / a pass / a model kind".
"""
from compressor.schemes.base import (Scheme, quantize_modes, register_scheme, scheme_class,
                                     scheme_of_step)
from compressor.schemes.builtin import (FLOAT32, Float16, Float32, Int4WeightOnly, Int8Dynamic,
                                        Int8Qat, Int8Scheme, Int8Static, Int8WeightOnly)
from compressor.schemes.handlers import (ExportHandler, apply_handler, apply_scheme, export_handler,
                                         find_apply, find_export, formats_of)

__all__ = ["FLOAT32", "ExportHandler", "Float16", "Float32", "Int4WeightOnly", "Int8Dynamic",
           "Int8Qat", "Int8Scheme", "Int8Static", "Int8WeightOnly", "Scheme", "apply_handler", "apply_scheme",
           "export_handler", "find_apply", "find_export", "formats_of", "quantize_modes",
           "register_scheme", "scheme_class", "scheme_of_step"]

"""The built-in schemes: float32 (no step), float16 (a precision step), int8 in four modes
and weight-only int4 (a quantize step).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from compressor.schemes.base import Scheme, register_scheme


@dataclass(frozen=True)
class Float32(Scheme):
    """The model as trained: no quantize or precision step."""

    name: ClassVar[str] = "float32"
    dtype: ClassVar[str] = "float32"
    weight_bits: ClassVar[int] = 32


@dataclass(frozen=True)
class Float16(Scheme):
    """float16 weights (a precision step), float32 I/O unless keep_io_types is false."""

    name: ClassVar[str] = "float16"
    dtype: ClassVar[str] = "float16"
    weight_bits: ClassVar[int] = 16
    exclude: tuple[str, ...] = ()        # layer-name patterns kept in float32
    keep_io_types: bool = True


@dataclass(frozen=True)
class Int8Scheme(Scheme):
    """What every int8 mode shares; a quantize step's keys of the same name fill it."""

    dtype: ClassVar[str] = "int8"
    weight_bits: ClassVar[int] = 8
    integer: ClassVar[bool] = True
    # How the built-in converters and quantizers make it (ptq, qat, dynamic, weight_only): a
    # scheme subclassing a built-in one inherits this with its handlers, whatever its name.
    method: ClassVar[str]
    calibration_samples: int = 256
    io_dtype: str = "float32"
    fallback: str = "none"               # auto: the fallback search may keep layers float
    fallback_dtype: str = "float16"


@register_scheme
@dataclass(frozen=True)
class Int8Static(Int8Scheme):
    """Weights and activations int8, ranges calibrated on training samples."""

    name: ClassVar[str] = "ptq"
    method: ClassVar[str] = "ptq"
    report_name: ClassVar[str] = "static"
    int8_compute: ClassVar[bool] = True


@register_scheme
@dataclass(frozen=True)
class Int8Qat(Int8Scheme):
    """Weights and activations int8, ranges learned by fine-tuning with fake-quant.
    `training` is the step itself: its epochs, lr, preserve_sparsity, freeze_bn_after."""

    name: ClassVar[str] = "qat"
    method: ClassVar[str] = "qat"
    int8_compute: ClassVar[bool] = True
    training: Any = None

    @classmethod
    def from_step(cls, step: Any) -> Scheme:
        return dataclasses.replace(super().from_step(step), training=step)


@register_scheme
@dataclass(frozen=True)
class Int8Dynamic(Int8Scheme):
    """int8 weights per channel; activations quantized at run time (transformers, RNNs)."""

    name: ClassVar[str] = "dynamic"
    method: ClassVar[str] = "dynamic"


@register_scheme
@dataclass(frozen=True)
class Int8WeightOnly(Int8Scheme):
    """int8 weights per channel, float compute (each weight dequantized at load time)."""

    name: ClassVar[str] = "weight_only"
    method: ClassVar[str] = "weight_only"


@register_scheme
@dataclass(frozen=True)
class Int4WeightOnly(Scheme):
    """int4 weights per group of `group_size` input channels, a scale each (and a 4-bit zero
    point when not `symmetric`), float compute: what language models on 8 GB boards run, since
    decoding reads every weight once per token. `algorithm` picks the integers (gptq / rtn)."""

    name: ClassVar[str] = "weight_only"
    dtype: ClassVar[str] = "int4"
    weight_bits: ClassVar[int] = 4
    integer: ClassVar[bool] = True
    method: ClassVar[str] = "weight_only"
    group_size: int = 32
    algorithm: str = "gptq"
    calibration_windows: int | None = None
    symmetric: bool = True


FLOAT32 = Float32()

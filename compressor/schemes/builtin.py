"""The built-in schemes: float32 (no step), float16 (a precision step), int8 in four modes
and weight-only int4 (a quantize step). Each quantize scheme's `key` fields are its recipe
keys (config/steps.py makes its step model from them).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from compressor.decoders.storage import Grid, WeightStorage
from compressor.schemes.base import Scheme, key, register_scheme

# The LLM route's int8 blocks (MatMulNBits blocks are powers of two; 128 is as good as per
# channel at 8 bits), fewer where a model's widths need
INT8_GROUP = 128
CALIBRATION_WINDOWS = ("language models: calibration windows of validate.window tokens each "
                       "(default 32)")


@dataclass(frozen=True)
class Float32(Scheme):
    """The model as trained: no quantize or precision step."""

    name: ClassVar[str] = "float32"
    dtype: ClassVar[str] = "float32"
    weight_bits: ClassVar[int] = 32

    @property
    def storage(self) -> WeightStorage:
        return WeightStorage.every(Grid(32))


@dataclass(frozen=True)
class Float16(Scheme):
    """float16 weights (a precision step), float32 I/O unless keep_io_types is false."""

    name: ClassVar[str] = "float16"
    dtype: ClassVar[str] = "float16"
    weight_bits: ClassVar[int] = 16
    exclude: tuple[str, ...] = ()        # layer-name patterns kept in float32
    keep_io_types: bool = True

    @property
    def storage(self) -> WeightStorage:
        return WeightStorage.every(Grid(16))


@dataclass(frozen=True)
class Int8Scheme(Scheme):
    """What every int8 mode shares."""

    dtype: ClassVar[str] = "int8"
    weight_bits: ClassVar[int] = 8
    integer: ClassVar[bool] = True
    # How the built-in converters and quantizers make it (ptq, qat, dynamic, weight_only): a
    # scheme subclassing a built-in one inherits this with its handlers, whatever its name.
    method: ClassVar[str]
    calibration_samples: int = key(256, "training samples used to calibrate ptq", ge=1)
    io_dtype: Literal["float32", "int8"] = key(
        "float32", "artifact input/output type; float32 is what most apps feed")
    fallback: Literal["none", "auto"] = key(
        "none", "auto: keep the most sensitive layers float until the gate passes")
    fallback_dtype: Literal["float16", "float32"] = key(
        "float16", "the type the layers auto fallback keeps float are stored in")
    max_float_layers: int = key(3, "most layers the fallback may keep float", ge=1)
    calibration_windows: int | None = key(None, CALIBRATION_WINDOWS, ge=1, le=4096)


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
    trains: ClassVar[bool] = True
    preserve_sparsity: bool = key(True, "keep pruned weights at zero during QAT")
    freeze_bn_after: int | None = key(
        1, "qat: BatchNorm statistics frozen after this many epochs (0: from the start; unset: "
        "never), so fine-tuning sees the statistics inference uses", ge=0)
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
    """int8 weights per channel, float compute (each weight dequantized at load time); a
    language model's: a scale and a zero point per group of INT8_GROUP, round to nearest (at
    8 bits GPTQ buys nothing measurable)."""

    name: ClassVar[str] = "weight_only"
    method: ClassVar[str] = "weight_only"
    algorithm: ClassVar[str] = "rtn"

    @property
    def storage(self) -> WeightStorage:
        return WeightStorage.every(Grid(8, INT8_GROUP, symmetric=False, fit_group=True))


def _power_of_two(value: int) -> int:
    if value & (value - 1):
        raise ValueError(f"must be a power of two (16, 32, 64, 128, ...), got {value}: the "
                         "runtimes' int4 kernels work on power-of-two blocks")
    return value


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
    group_size: int = key(
        32, "weight_only int4: input channels sharing one scale (and zero point), a power of "
        "two (32: the quality default; 128: smaller, less accurate)", ge=16, le=1024,
        check=_power_of_two)
    algorithm: Literal["auto", "gptq", "gptq_act_order", "rtn"] = key(
        "auto", "auto (try each on this model, keep the one closest to the float model on "
        "held-out calibration windows), gptq (calibrated: each column's rounding error is "
        "compensated in the columns not yet quantized), gptq_act_order (the same, columns in "
        "order of input energy on fixed groups) or rtn (round to nearest)")
    int8_budget: float = key(
        1.15, "bytes of the weight matrices at most this many times their all-int4 bytes: the "
        "matrices whose int4 rounding moves the model most (measured, e.g. a small model's tied "
        "embedding / lm_head) are kept at int8 when that brings it closer to the float model; "
        "1.0: every matrix int4", ge=1.0, le=2.0)
    calibration_windows: int | None = key(None, CALIBRATION_WINDOWS, ge=1, le=4096)
    symmetric: bool = key(
        True, "a symmetric grid (zero point 8, bfloat16-exact scales, no zero points stored) "
        "that ONNX and LiteRT both store exactly; false: a 4-bit zero point per group (ONNX; "
        "LiteRT computes only symmetric int4 and rounds it again)")

    @property
    def storage(self) -> WeightStorage:
        return WeightStorage.every(Grid(4, self.group_size, self.symmetric),
                                   int8_budget=self.int8_budget)


FLOAT32 = Float32()


@register_scheme
@dataclass(frozen=True)
class Int4Qat(Int4WeightOnly):
    """A language model's int4 weight-only integers fine-tuned with fake quantization (`int4_qat`):
    the `int4` integers as the starting point, trained on the recipe's text with the original
    model as teacher (KL of its next-token distribution), a straight-through gradient; stored
    as `int4` stores its integers (the trained ones, rounded nowhere else)."""

    name: ClassVar[str] = "qat"
    method: ClassVar[str] = "qat"
    trains: ClassVar[bool] = True
    learn_scales: bool = key(
        True, "train each group's scale too (bfloat16-exact in the forward, as stored); false: "
        "the starting scales stay")
    temperature: float = key(1.0, "the teacher's and student's softmax temperature", gt=0)
    hard_weight: float = key(
        0.0, "weight of the next-token cross-entropy beside the teacher's KL (0: KL only)",
        ge=0.0, le=1.0)
    calibration_windows: int | None = key(
        128, "language models: training windows of validate.window tokens each (the same "
        "calibration text the starting int4 integers are chosen on)", ge=1, le=4096)
    training: Any = None

    @classmethod
    def from_step(cls, step: Any) -> Scheme:
        return dataclasses.replace(super().from_step(step), training=step)

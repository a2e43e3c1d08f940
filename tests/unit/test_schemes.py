"""The scheme registry, the handler table and the bit-width gate: pure modules, no framework."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest

from compressor.errors import RecipeError
from compressor.runtimes.base import WeightTensor
from compressor.schemes import (FLOAT32, Float16, Int8Dynamic, Int8Qat, Int8Scheme, Int8Static,
                                Int8WeightOnly, Scheme, apply_handler, apply_scheme,
                                export_handler, find_apply, find_export, formats_of,
                                scheme_class)
from compressor.config.steps import PrecisionConfig, QuantizeConfig
from compressor.runtimes.weights import dtype_bits, weight_share_at


def test_each_builtin_mode_builds_its_scheme_from_the_step():
    step = QuantizeConfig(mode="ptq", calibration_samples=64, fallback="auto",
                          fallback_dtype="float32")
    scheme = scheme_class(step.mode, step.dtype).from_step(step)
    assert scheme == Int8Static(calibration_samples=64, io_dtype="float32", fallback="auto",
                                fallback_dtype="float32")
    assert (scheme.weight_bits, scheme.integer, scheme.int8_compute) == (8, True, True)
    assert scheme.label == "int8 ptq" and scheme.report_name == "static"
    qat = QuantizeConfig(mode="qat", epochs=3)
    assert scheme_class("qat", "int8").from_step(qat).training is qat
    assert scheme_class("dynamic", "int8") is Int8Dynamic and not Int8Dynamic.int8_compute
    assert scheme_class("weight_only", "int8") is Int8WeightOnly
    half = Float16.from_step(PrecisionConfig(exclude=("dense*",), keep_io_types=False))
    assert half == Float16(exclude=("dense*",), keep_io_types=False) and half.weight_bits == 16
    assert FLOAT32.label == "float32" and not FLOAT32.integer


def test_unknown_modes_and_dtypes_name_what_is_registered():
    with pytest.raises(RecipeError, match="unknown quantize mode 'dynamik'.*did you mean "
                                          "'dynamic'.*dynamic, ptq, qat, weight_only"):
        scheme_class("dynamik", "int8")
    with pytest.raises(RecipeError, match="quantize dtype 'int3' has no scheme; use one of"):
        scheme_class("ptq", "int3")


@dataclass(frozen=True)
class _Tiny(Int8WeightOnly):
    name: ClassVar[str] = "tiny_test_scheme"


def test_handlers_are_found_through_the_scheme_classes(tmp_path):
    @export_handler(Int8Scheme, "unit-kind", "onnx", made_by="the int8 writer")
    def write(backend, state, scheme, path, ctx):
        return path

    @apply_handler(Int8WeightOnly, "unit-kind")
    def apply(backend, state, scheme, ctx):
        return state.replace(model="applied")

    assert find_export(_Tiny(), "unit-kind", "onnx").made_by == "the int8 writer"
    assert find_apply(_Tiny(), "unit-kind") is apply and find_apply(Int8Static(), "unit-kind") is None
    assert formats_of("unit-kind") == ("onnx",)
    with pytest.raises(RecipeError, match="the unit-kind backend cannot write tflite files in "
                                          r"int8 tiny_test_scheme; export onnx \(--format onnx\)"):
        find_export(_Tiny(), "unit-kind", "tflite")
    with pytest.raises(RuntimeError, match="registered twice"):
        apply_handler(Int8WeightOnly, "unit-kind")(apply)

    from compressor.core.context import ModelState

    class Kind:
        name = "unit-kind"

    state = apply_scheme(Kind(), ModelState(model="m"), _Tiny(), ctx=None)
    assert state.model == "applied" and state.scheme == _Tiny()
    plain = apply_scheme(Kind(), ModelState(model="m"), Int8Static(), ctx=None)
    assert plain.model == "m" and isinstance(plain.scheme, Int8Static)


def _weight(name, dtype, size):
    return WeightTensor(name=name, dtype=dtype, shape=(size,), zeros=0, is_kernel=True)


def test_the_weight_share_counts_bytes_at_the_schemes_bit_width():
    weights = [_weight("q", "int8", 9000), _weight("emb", "float32", 1000 * 2),
               _weight("bias", "float32", 64)]              # under 1024 elements: not counted
    share, largest = weight_share_at(weights, 8)
    assert share == pytest.approx(9000 / (9000 + 8000))
    assert largest == ["emb (float32, 7.8 KB)"]
    # int4 packed two to a byte: 8000 elements are 4000 bytes, and count at 4 bits only
    packed = [_weight("w", "int4", 8000), _weight("lm_head", "int8", 2000)]
    assert weight_share_at(packed, 4)[0] == pytest.approx(4000 / 6000)
    assert weight_share_at(packed, 8)[0] == pytest.approx(2000 / 6000)
    assert weight_share_at([_weight("h", "float16", 4096)], 8) == (0.0, ["h (float16, 8.0 KB)"])
    assert weight_share_at([], 8) == (1.0, [])
    assert [dtype_bits(d) for d in ("int4", "uint8", "float16", "float32")] == [4, 8, 16, 32]


def test_scheme_is_the_base_of_every_builtin():
    assert all(issubclass(cls, Scheme) for cls in (Int8Qat, Int8Static, Float16))


def test_a_quantize_step_parses_into_its_schemes_typed_model():
    import pickle

    from compressor.config.steps import quantize_step_model
    from compressor.schemes import Int4WeightOnly

    step = QuantizeConfig(mode="weight_only", dtype="int4", group_size=64, algorithm="rtn")
    assert type(step) is quantize_step_model(Int4WeightOnly) and isinstance(step, QuantizeConfig)
    assert step.scheme == Int4WeightOnly(group_size=64, algorithm="rtn")
    assert pickle.loads(pickle.dumps(step)) == step
    keys = {cls: set(quantize_step_model(cls).model_fields) for cls in (Int8Static, Int8Qat,
                                                                         Int4WeightOnly)}
    assert {"group_size", "symmetric", "epochs", "fallback"} & keys[Int4WeightOnly] == {"group_size",
                                                                                        "symmetric"}
    assert "epochs" in keys[Int8Qat] and "epochs" not in keys[Int8Static]
    assert QuantizeConfig(mode="qat").trains and not QuantizeConfig(mode="ptq").trains


def test_a_scheme_declares_how_a_language_model_stores_its_weights():
    from compressor.decoders.storage import Grid, WeightStorage
    from compressor.schemes import Float32, Int4WeightOnly

    assert Int4WeightOnly(group_size=64, symmetric=False).storage == \
        WeightStorage.every(Grid(4, 64, symmetric=False), int8_budget=1.15)
    assert Int4WeightOnly(int8_budget=1.0).storage.int8_budget == 1.0
    int8 = Int8WeightOnly().storage.linears
    assert (int8.bits, int8.group_size, int8.symmetric, int8.fit_group) == (8, 128, False, True)
    assert int8.group_for([96, 160]) == 32 and int8.group_for([100]) is None
    assert Int8Static().storage is None and Int8Dynamic().storage is None
    assert [s.storage.precision for s in (Float32(), Float16(), Int8WeightOnly(),
                                          Int4WeightOnly())] == ["fp32", "fp16", "int8", "int4"]

"""int8 quantization: quantization-aware training (qat) or post-training calibration (ptq)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from compressor.context import Context, ModelState
from compressor.passes.order import refuse_after_quantize, refuse_mixing_int8_and_float16
from compressor.errors import RecipeError
from compressor.registry import TrainingConfig, register_pass

# Kept as an open list: transformer-friendly modes (dynamic, weight_only) slot in here.
QuantizeMode = Literal["qat", "ptq"]


class QuantizeConfig(TrainingConfig):
    kind: Literal["quantize"] = Field("quantize", alias="pass")
    mode: QuantizeMode = Field("qat", description="qat (fine-tune with fake-quant) or ptq (calibrate)")
    dtype: Literal["int8"] = "int8"
    preserve_sparsity: bool = Field(True, description="keep pruned weights at zero during QAT")
    calibration_samples: int = Field(256, ge=1, description="training samples used to calibrate ptq")
    io_dtype: Literal["float32", "int8"] = Field(
        "float32", description="artifact input/output type; float32 is what most apps feed")
    fallback: Literal["none", "auto"] = Field(
        "none", description="auto: keep the most sensitive layers float until the gate passes")
    fallback_dtype: Literal["float16", "float32"] = "float16"
    max_float_layers: int = Field(3, ge=1, description="most layers the fallback may keep float")


@register_pass(QuantizeConfig)
def quantize(state: ModelState, config: QuantizeConfig, ctx: Context) -> ModelState:
    if config.fallback == "auto" and config.mode == "qat":
        # The search re-quantizes once per candidate layer: with qat, one fine-tuning each.
        raise RecipeError("quantize fallback: auto works with mode: ptq (it re-quantizes the "
                          "model once per candidate layer); set mode: ptq or fallback: none")
    refuse_after_quantize(state, "quantize")
    refuse_mixing_int8_and_float16(state, "quantize")
    run = ctx.backend.quantize_qat if config.mode == "qat" else ctx.backend.quantize_ptq
    if config.fallback == "none":
        return run(state, config, ctx)
    from compressor.fallback import search_float_layers

    return search_float_layers(state, run(state, config, ctx), config, ctx, run)

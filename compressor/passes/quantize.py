"""int8 quantization: quantization-aware training (qat) or post-training calibration (ptq).

How a mode is carried out is the backend's business; with `fallback: auto` the search in
passes/fallback.py keeps the most sensitive layers float until the accuracy gate passes.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from compressor.context import Context, ModelState
from compressor.errors import RecipeError
from compressor.passes.order import refuse_after_quantize, refuse_mixing_int8_and_float16
from compressor.registry import register_pass
from compressor.steps import QuantizeConfig

if TYPE_CHECKING:
    from compressor.backends.base import Backend


@register_pass(QuantizeConfig)
def quantize(state: ModelState, config: QuantizeConfig, ctx: Context,
             backend: Backend) -> ModelState:
    if config.fallback == "auto" and config.mode == "qat":
        # The search re-quantizes once per candidate layer: with qat, one fine-tuning each.
        raise RecipeError("quantize fallback: auto works with mode: ptq (it re-quantizes the "
                          "model once per candidate layer); set mode: ptq or fallback: none")
    refuse_after_quantize(state, "quantize")
    refuse_mixing_int8_and_float16(state, "quantize")

    def quantized(float_state: ModelState) -> ModelState:
        return backend.quantize(float_state, config, ctx).after(config)

    if config.fallback == "none":
        return quantized(state)
    from compressor.passes.fallback import search_float_layers

    return search_float_layers(state, config, ctx, backend, quantized)

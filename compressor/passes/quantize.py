"""int8 quantization: quantization-aware training (qat) or post-training calibration (ptq).

How a mode is carried out is the backend's business; with `fallback: auto` the search in
passes/fallback.py keeps the most sensitive layers float until the accuracy gate passes.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compressor.context import Context, ModelState
from compressor.errors import RecipeError
from compressor.int8_mode import post_training_mode
from compressor.passes.order import refuse_after_quantize, refuse_mixing_int8_and_float16
from compressor.registry import register_pass
from compressor.steps import QuantizeConfig
from compressor.tensors import take

if TYPE_CHECKING:
    from compressor.backends.base import Backend


@dataclass(frozen=True)
class QuantizeChoice:
    """report.json `quantize`: the int8 mode used and why."""

    mode: str
    reason: str
    key: str = "quantize"

    def report(self, artifacts: Mapping[str, Path]) -> dict[str, Any]:
        return {"mode": self.mode, "reason": self.reason}


MODE_NAMES = {"ptq": "static", "qat": "qat", "dynamic": "dynamic", "weight_only": "weight_only"}


def _chosen_mode(state: ModelState, config: QuantizeConfig, ctx: Context,
                 backend: Backend) -> tuple[QuantizeConfig, QuantizeChoice]:
    """A `ptq` step is static int8 for conv / dense models and dynamic int8 for models with
    attention, LayerNorm, embeddings or recurrent layers (int8_mode.py says why); other
    modes are the recipe's choice."""
    if config.mode != "ptq":
        return config, QuantizeChoice(MODE_NAMES[config.mode], "set by the recipe")
    example = None if ctx.data.val is None else take(ctx.data.val[0], slice(0, 2))
    mode, reason = post_training_mode(backend.describe(state.model, example).layer_kinds)
    return config.model_copy(update={"mode": mode}), QuantizeChoice(MODE_NAMES[mode], reason)


@register_pass(QuantizeConfig)
def quantize(state: ModelState, config: QuantizeConfig, ctx: Context,
             backend: Backend) -> ModelState:
    if config.fallback == "auto" and config.mode == "qat":
        # The search re-quantizes once per candidate layer: with qat, one fine-tuning each.
        raise RecipeError("quantize fallback: auto works with mode: ptq (it re-quantizes the "
                          "model once per candidate layer); set mode: ptq or fallback: none")
    refuse_after_quantize(state, "quantize")
    refuse_mixing_int8_and_float16(state, "quantize")
    config, choice = _chosen_mode(state, config, ctx, backend)
    state = state.with_section(choice)

    def quantized(float_state: ModelState) -> ModelState:
        return backend.quantize(float_state, config, ctx).after(config)

    if config.fallback == "none":
        return quantized(state)
    from compressor.passes.fallback import search_float_layers

    return search_float_layers(state, config, ctx, backend, quantized)

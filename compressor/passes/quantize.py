"""Quantization: the step's mode and dtype name a scheme (compressor/schemes), which the
model kind's handlers apply (QAT fine-tuning, calibration) and export.

With `fallback: auto` the search in passes/fallback.py keeps the most sensitive layers float
until the accuracy gate passes.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compressor.core.context import Context, ModelState
from compressor.errors import RecipeError
from compressor.core.int8_mode import post_training_mode
from compressor.passes.registry import register_pass
from compressor.schemes import apply_scheme, scheme_class, scheme_of_step
from compressor.config.order import check_can_follow
from compressor.config.steps import QuantizeConfig
from compressor.core.tensors import take

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


def _chosen_mode(state: ModelState, config: QuantizeConfig, ctx: Context,
                 backend: Backend) -> tuple[QuantizeConfig, QuantizeChoice]:
    """A `ptq` step is static int8 for conv / dense models and dynamic int8 for models with
    attention, LayerNorm, embeddings or recurrent layers (int8_mode.py says why); other
    modes are the recipe's choice."""
    if config.mode != "ptq":
        return config, QuantizeChoice(_report_name(config), "set by the recipe")
    example = None if ctx.data.val is None else take(ctx.data.val[0], slice(0, 2))
    mode, reason = post_training_mode(backend.describe(state.model, example).layer_kinds)
    config = config.model_copy(update={"mode": mode})
    return config, QuantizeChoice(_report_name(config), reason)


def _report_name(config: QuantizeConfig) -> str:
    """report.json quantize.mode: ptq is reported as "static"."""
    scheme = scheme_class(config.mode, config.dtype)
    return scheme.report_name or scheme.name


@register_pass(QuantizeConfig)
def quantize(state: ModelState, config: QuantizeConfig, ctx: Context,
             backend: Backend) -> ModelState:
    fallback = getattr(config, "fallback", "none")   # a key of the int8 schemes only
    if fallback == "auto" and config.mode == "qat":
        # The search re-quantizes once per candidate layer: with qat, one fine-tuning each.
        raise RecipeError("quantize fallback: auto works with mode: ptq (it re-quantizes the "
                          "model once per candidate layer); set mode: ptq or fallback: none")
    check_can_follow(state.steps, config)
    config, choice = _chosen_mode(state, config, ctx, backend)
    ctx.record.add_section(choice)
    scheme = scheme_of_step(config)

    def quantized(float_state: ModelState) -> ModelState:
        return apply_scheme(backend, float_state, scheme, ctx).after(config)

    if fallback == "none":
        return quantized(state)
    from compressor.passes.fallback import search_float_layers

    return search_float_layers(state, config, ctx, backend, quantized)

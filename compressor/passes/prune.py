"""Magnitude pruning: zero the smallest weights of each layer, fine-tuning while the mask grows."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from compressor.context import Context, ModelState
from compressor.passes.order import refuse_after_quantize
from compressor.registry import TrainingConfig, register_pass


class PruneConfig(TrainingConfig):
    kind: Literal["prune"] = Field("prune", alias="pass")
    sparsity: float = Field(gt=0.0, lt=1.0,
                            description="the fraction of weights to set to zero, e.g. 0.3")
    schedule: Literal["constant", "polynomial"] = Field(
        "polynomial", description="constant: full sparsity from the start; polynomial: ramp up")


@register_pass(PruneConfig)
def prune(state: ModelState, config: PruneConfig, ctx: Context) -> ModelState:
    refuse_after_quantize(state, "prune")
    return ctx.backend.prune(state, config, ctx)

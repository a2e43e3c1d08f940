"""Magnitude pruning: zero the smallest weights of each layer, fine-tuning while the mask grows."""
from __future__ import annotations

from typing import TYPE_CHECKING

from compressor.context import Context, ModelState
from compressor.passes.order import refuse_after_quantize
from compressor.registry import register_pass
from compressor.steps import PruneConfig

if TYPE_CHECKING:
    from compressor.backends.base import Backend


@register_pass(PruneConfig)
def prune(state: ModelState, config: PruneConfig, ctx: Context, backend: Backend) -> ModelState:
    refuse_after_quantize(state, "prune")
    return backend.prune(state, config, ctx).after(config)

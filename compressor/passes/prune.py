"""Magnitude pruning: zero the smallest weights of each layer, fine-tuning while the mask grows."""
from __future__ import annotations

from typing import TYPE_CHECKING

from compressor.backends.base import Pruning, capable
from compressor.core.context import Context, ModelState
from compressor.passes.registry import register_pass
from compressor.config.order import check_can_follow
from compressor.config.steps import PruneConfig

if TYPE_CHECKING:
    from compressor.backends.base import Backend


@register_pass(PruneConfig)
def prune(state: ModelState, config: PruneConfig, ctx: Context, backend: Backend) -> ModelState:
    check_can_follow(state.steps, config)
    pruner = capable(backend, Pruning, "pruning needs a Keras or PyTorch model")
    return pruner.prune(state, config, ctx).after(config)

"""Knowledge distillation: train the student on a frozen teacher's soft targets.

The step trains for its own epochs and stays recorded in the state, so later fine-tuning
steps (pruning, QAT) can keep learning from the teacher too (`guide_later_steps`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from compressor.backends.base import Distilling, capable
from compressor.core.context import Context, ModelState
from compressor.errors import RecipeError
from compressor.passes.registry import register_pass
from compressor.config.order import check_can_follow
from compressor.config.steps import DistillConfig

if TYPE_CHECKING:
    from compressor.backends.base import Backend


@register_pass(DistillConfig)
def distill(state: ModelState, config: DistillConfig, ctx: Context, backend: Backend) -> ModelState:
    if ctx.teacher is None:
        raise RecipeError("a distill step needs a teacher model; pass --teacher MODEL "
                          "(or teacher=... in Python)")
    check_can_follow(state.steps, config)
    student = capable(backend, Distilling, "distillation needs a Keras or PyTorch model")
    return student.distill(state, config, ctx).after(config)

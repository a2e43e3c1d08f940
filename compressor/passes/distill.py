"""Knowledge distillation: train the student on a frozen teacher's soft targets.

The step trains for its own epochs and stays recorded in the state, so later fine-tuning
steps (pruning, QAT) keep learning from the teacher too.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from compressor.context import Context, ModelState
from compressor.errors import RecipeError
from compressor.registry import register_pass
from compressor.steps import DistillConfig, QuantizeConfig

if TYPE_CHECKING:
    from compressor.backends.base import Backend


@register_pass(DistillConfig)
def distill(state: ModelState, config: DistillConfig, ctx: Context, backend: Backend) -> ModelState:
    if ctx.teacher is None:
        raise RecipeError("a distill step needs a teacher model; pass --teacher MODEL "
                          "(or teacher=... in Python)")
    quantized = state.last(QuantizeConfig)
    if quantized is not None and quantized.mode == "ptq":
        # A ptq state's int8 ranges come from calibration: training after it would void them.
        raise RecipeError("a distill step after a ptq quantize step would change the model its "
                          "int8 ranges were calibrated on; put distill before quantize")
    return backend.distill(state, config, ctx).after(config)

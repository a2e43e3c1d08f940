"""Knowledge distillation: train the student on a frozen teacher's soft targets.

The step trains for its own epochs and stays active, so later fine-tuning steps
(pruning, QAT) keep learning from the teacher too.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from compressor.context import Context, ModelState
from compressor.errors import RecipeError
from compressor.registry import TrainingConfig, register_pass


class DistillConfig(TrainingConfig):
    kind: Literal["distill"] = Field("distill", alias="pass")
    temperature: float = Field(4.0, gt=0, description="softens both models' logits, e.g. 4.0")
    alpha: float = Field(0.7, ge=0.0, le=1.0,
                         description="weight of the teacher term vs the hard-label loss, e.g. 0.7")
    loss: Literal["kl", "mse"] = Field("kl", description="kl on soft targets, or mse on logits")


@register_pass(DistillConfig)
def distill(state: ModelState, config: DistillConfig, ctx: Context) -> ModelState:
    if ctx.teacher is None:
        raise RecipeError("a distill step needs a teacher model; pass --teacher MODEL "
                          "(or teacher=... in Python)")
    if state.quantize is not None and state.quantize.mode == "ptq":
        # A ptq state's int8 ranges come from calibration: training after it would void them.
        raise RecipeError("a distill step after a ptq quantize step would change the model its "
                          "int8 ranges were calibrated on; put distill before quantize")
    return ctx.backend.distill(state, config, ctx)

"""Knowledge distillation: train the student on a frozen teacher's soft targets.

The step trains for its own epochs and stays active, so later fine-tuning steps
(pruning, QAT) keep learning from the teacher too.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from compressor.context import Context, ModelState
from compressor.registry import TrainingConfig, register_pass


class DistillConfig(TrainingConfig):
    kind: Literal["distill"] = Field("distill", alias="pass")
    temperature: float = Field(4.0, gt=0, description="softens both models' logits, e.g. 4.0")
    alpha: float = Field(0.7, ge=0.0, le=1.0,
                         description="weight of the teacher term vs the hard-label loss, e.g. 0.7")
    loss: Literal["kl", "mse"] = Field("kl", description="kl on soft targets, or mse on logits")


@register_pass(DistillConfig)
def distill(state: ModelState, config: DistillConfig, ctx: Context) -> ModelState:
    return ctx.backend.distill(state, config, ctx)

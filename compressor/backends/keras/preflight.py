"""Refusals a Keras model earns from its layers alone, made before the first step runs.

A step that cannot work on the model (tfmot's QAT on a layer it cannot wrap) used to fail
when its turn came, after minutes of pruning or distillation; the same check runs here on
the loaded model instead, in milliseconds (layer types only, nothing is built or trained).
"""
from __future__ import annotations

from typing import Any

from compressor.errors import RecipeError
from compressor.config.steps import QuantizeConfig, StepConfig

SHOWN, NAME_CHARS = 2, 40   # blocking layers named in the one-line refusal, and their length


def check_steps(model: Any, steps: tuple[StepConfig, ...]) -> None:
    """A RecipeError (exit 2) for the first step that cannot run on `model`."""
    for index, step in enumerate(steps):
        if isinstance(step, QuantizeConfig) and step.mode == "qat":
            _check_qat(model, index)


def _check_qat(model: Any, index: int) -> None:
    from compressor.backends.keras.qat_layers import qat_blockers

    blockers = qat_blockers(model)
    if not blockers:
        return
    more = f" and {len(blockers) - SHOWN} more" if len(blockers) > SHOWN else ""
    named = ", ".join(blocker[:NAME_CHARS] for blocker in blockers[:SHOWN])
    raise RecipeError(
        f"steps.{index} (quantize, mode: qat): tfmot's int8 quantization-aware training cannot "
        f"wrap layer {named}{more}; use quantize mode: ptq (the converter quantizes it) or "
        "build it from layers tfmot supports (Conv2D, DepthwiseConv2D, Dense)")

"""Which steps may follow which: the one home of the order rules.

Recipes are checked as a whole when loaded (`recipe_order_error`); passes and the
training-loop API check the state a step is about to be applied to (`check_can_follow`,
`check_user_loop_step`), since the Python API can apply steps to a state that already went
through others (prepare / finalize). Imports only step configs and errors.
"""
from __future__ import annotations

from collections.abc import Sequence

from compressor.errors import RecipeError
from compressor.config.steps import PrecisionConfig, QuantizeConfig, StepConfig


def recipe_order_error(steps: Sequence[StepConfig]) -> str | None:
    """What is wrong with a recipe's step order (the recipe validator's message), or None."""
    kinds = [step.kind for step in steps]
    if kinds.count("quantize") > 1:
        return "has more than one quantize step; keep one (qat or ptq)"
    if "quantize" in kinds and "precision" in kinds:
        return ("mixes quantize and precision; for int8 with float layers use quantize with "
                "`fallback: auto`")
    if "quantize" in kinds and "prune" in kinds[kinds.index("quantize") + 1:]:
        return "prunes after quantize; put the prune step before quantize"
    sparsities = [step.sparsity for step in steps if step.kind == "prune"]
    if any(later < earlier for earlier, later in zip(sparsities, sparsities[1:])):
        return (f"prunes to sparsity {sparsities} in turn; a later prune step with a lower "
                "sparsity would undo the earlier one: keep one prune step at the sparsity you want")
    return None


def _last(applied: Sequence[StepConfig], kind: type) -> StepConfig | None:
    return next((step for step in reversed(applied) if isinstance(step, kind)), None)


def check_can_follow(applied: Sequence[StepConfig], step: StepConfig) -> None:
    """RecipeError when `step` may not run after the steps already `applied`."""
    quantized, halved = _last(applied, QuantizeConfig), _last(applied, PrecisionConfig)
    if step.kind in ("prune", "quantize") and quantized is not None:
        raise RecipeError(f"a {step.kind} step after an int8 quantize step would undo or repeat "
                          "it; put quantize last in the recipe's steps")
    if step.kind == "quantize" and halved is not None:
        raise RecipeError("int8 quantize after a float16 precision step: an artifact is either "
                          "int8 or float16; remove one of the steps (or use quantize fallback: auto)")
    if step.kind == "precision" and quantized is not None:
        raise RecipeError("a precision step after an int8 quantize step has nothing left to "
                          "convert: an artifact is either int8 or float16; remove one of the steps")
    if step.kind == "distill" and quantized is not None and quantized.mode == "ptq":
        # A ptq state's int8 ranges come from calibration: training after it would void them.
        raise RecipeError("a distill step after a ptq quantize step would change the model its "
                          "int8 ranges were calibrated on; put distill before quantize")


def check_user_loop_step(applied: Sequence[StepConfig], step: StepConfig | None) -> None:
    """The step handed to a user's loop (cz.prepare) may not train a quantized model."""
    if step is not None and _last(applied, QuantizeConfig) is not None:
        raise RecipeError(f"a {step.kind} step after an int8 quantize step would undo its "
                          "ranges; put quantize last in the recipe's steps")

"""Step-order rules every backend shares, checked on the run state before a pass runs.

Recipes are checked when loaded (recipe.py); these guard the Python API too, where steps can
be applied to a state that already went through others (prepare / finalize).
"""
from __future__ import annotations

from compressor.context import ModelState
from compressor.errors import RecipeError
from compressor.steps import PrecisionConfig, QuantizeConfig


def refuse_after_quantize(state: ModelState, step: str) -> None:
    if state.last(QuantizeConfig) is not None:
        raise RecipeError(f"a {step} step after an int8 quantize step would undo or repeat it; "
                          "put quantize last in the recipe's steps")


def refuse_mixing_int8_and_float16(state: ModelState, step: str) -> None:
    """An artifact is either int8 or float16 (mixed int8/float is quantize `fallback: auto`)."""
    if step == "quantize" and state.last(PrecisionConfig) is not None:
        raise RecipeError("int8 quantize after a float16 precision step: an artifact is either "
                          "int8 or float16; remove one of the steps (or use quantize fallback: auto)")
    if step == "precision" and state.last(QuantizeConfig) is not None:
        raise RecipeError("a precision step after an int8 quantize step has nothing left to "
                          "convert: an artifact is either int8 or float16; remove one of the steps")

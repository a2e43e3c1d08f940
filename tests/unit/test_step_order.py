"""The order rules, in their one home: recipes as a whole, and steps applied to a state."""
from __future__ import annotations

import pytest

from compressor.errors import RecipeError
from compressor.config.order import check_can_follow, check_user_loop_step, recipe_order_error
from compressor.config.steps import DistillConfig, PrecisionConfig, PruneConfig, QuantizeConfig

PRUNE, PTQ, QAT = PruneConfig(sparsity=0.3), QuantizeConfig(mode="ptq"), QuantizeConfig()
HALF, KD = PrecisionConfig(), DistillConfig()


@pytest.mark.parametrize("steps, message", [
    ((PTQ, QAT), "more than one quantize step"),
    ((PTQ, HALF), "mixes quantize and precision"),
    ((QAT, PRUNE), "prunes after quantize"),
    ((PruneConfig(sparsity=0.5), PRUNE), r"prunes to sparsity \[0.5, 0.3\] in turn"),
])
def test_recipe_orders_refused_with_their_reason(steps, message):
    assert recipe_order_error(steps) is not None
    with pytest.raises(AssertionError):
        assert recipe_order_error(steps) is None
    import re

    assert re.search(message, recipe_order_error(steps))


@pytest.mark.parametrize("steps", [(), (PRUNE, QAT), (KD, PRUNE, PTQ), (PRUNE, HALF),
                                   (PRUNE, PruneConfig(sparsity=0.5))])
def test_recipe_orders_allowed(steps):
    assert recipe_order_error(steps) is None


@pytest.mark.parametrize("applied, step, message", [
    ((PTQ,), PRUNE, "a prune step after an int8 quantize step"),
    ((QAT,), QAT, "a quantize step after an int8 quantize step"),
    ((HALF,), PTQ, "int8 quantize after a float16 precision step"),
    ((PTQ,), HALF, "a precision step after an int8 quantize step"),
    ((PTQ,), KD, "a distill step after a ptq quantize step"),
])
def test_steps_refused_after_what_was_applied(applied, step, message):
    with pytest.raises(RecipeError, match=message):
        check_can_follow(applied, step)


def test_steps_allowed_after_what_was_applied():
    for applied, step in (((), PRUNE), ((PRUNE,), QAT), ((KD, PRUNE), PTQ), ((QAT,), KD),
                          ((PRUNE,), HALF)):
        check_can_follow(applied, step)   # raises nothing


def test_a_users_loop_may_not_train_a_quantized_model():
    with pytest.raises(RecipeError, match="a prune step after an int8 quantize step would "
                                          "undo its ranges"):
        check_user_loop_step((PTQ,), PRUNE)
    check_user_loop_step((PTQ,), None)      # plain fine-tuning hand-over: nothing to refuse
    check_user_loop_step((PRUNE,), QAT)

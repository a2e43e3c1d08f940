"""Issue 15 acceptance: distillation pays. Over 3 seeds the built-in `int8_prune30_kd`, with
its default settings, beats `int8_prune30` by >= 1 pt mean val accuracy for a student of
<= 1/4 the teacher's parameters trained briefly on the full digits training split, and is
never more than 0.5 pt worse for a converged student. Both frameworks.

Each recipe's steps run through the passes exactly as the pipeline runs them (no export:
the fake-quant model's val accuracy is what its artifacts reproduce, which
tests/passes/test_distill.py checks). Teachers and students are trained once per module.
"""
from __future__ import annotations

import numpy as np
import pytest
from support.distill_kits import KITS, kit_fixture

from compressor.core.context import ModelState
from compressor.config.recipe import load_recipe

pytestmark = pytest.mark.slow
SEEDS = (0, 1, 2)
BRIEF_EPOCHS = 1        # plain Adam from scratch: far from converged (0.4-0.8 val accuracy)
CONVERGED_EPOCHS = 20   # ~0.95-0.98, the teacher's level
RECIPES = ("int8_prune30", "int8_prune30_kd")


@pytest.fixture(scope="module", params=sorted(KITS))
def kit(request):
    yield from kit_fixture(request.param)


@pytest.fixture(scope="module")
def teacher(kit):
    return kit.good_teacher()


def _compressed_accuracy(kit, student, recipe: str, seed: int, teacher) -> float:
    ctx = kit.context(seed=seed, teacher=teacher)
    state = ModelState(model=kit.backend.clone(kit.backend.load(student)))
    for step in load_recipe(recipe).steps:
        state = kit.apply(state, step, ctx)
    return kit.accuracy(state.model)


@pytest.fixture(scope="module")
def outcomes(kit, teacher):
    """scenario -> {"student": [...], recipe: [...]} val accuracies, one per seed."""
    loaded_teacher = kit.backend.load(teacher)
    example = kit.data.val[0][:2]
    teacher_params = kit.backend.describe(teacher, example).params
    results = {}
    for scenario, epochs in (("brief", BRIEF_EPOCHS), ("converged", CONVERGED_EPOCHS)):
        rows = results[scenario] = {"student": [], **{recipe: [] for recipe in RECIPES}}
        for seed in SEEDS:
            student = kit.trained_student(epochs, seed)
            assert 4 * kit.backend.describe(student, example).params <= teacher_params
            rows["student"].append(kit.accuracy(student))
            for recipe in RECIPES:
                rows[recipe].append(_compressed_accuracy(kit, student, recipe, seed,
                                                         loaded_teacher))
        print(f"{kit.name} {scenario}: " + ", ".join(
            f"{name} {np.round(values, 4).tolist()} (mean {np.mean(values):.4f})"
            for name, values in rows.items()))
    return results


def test_kd_beats_plain_by_a_point_for_a_briefly_trained_quarter_size_student(kit, outcomes):
    brief = outcomes["brief"]
    assert np.mean(brief["student"]) <= np.mean(outcomes["converged"]["student"]) - 0.05
    assert np.mean(brief["int8_prune30_kd"]) >= np.mean(brief["int8_prune30"]) + 0.01


def test_kd_costs_a_converged_student_at_most_half_a_point(kit, outcomes):
    converged = outcomes["converged"]
    assert np.mean(converged["int8_prune30_kd"]) >= np.mean(converged["int8_prune30"]) - 0.005

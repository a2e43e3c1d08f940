"""Which recipes the array task runs. A language-model recipe (int4, int4_g128: scored by
perplexity on text) on a classifier / regressor / encoder is refused before the model is
loaded, naming the built-in recipes that fit the model (it failed after loading and scoring
it, on a metric the user never set)."""
from __future__ import annotations

from typing import Any

from compressor.config.recipe import Recipe, builtin_names, load_recipe
from compressor.errors import RecipeError

LANGUAGE_MODEL_METRIC = "perplexity"   # the language-model task's metric (tasks/lm)


def check_recipe_fits(recipe: Recipe, model_ref: Any) -> None:
    """RecipeError (exit 2) when `recipe` is a language-model recipe."""
    if recipe.validation.metric != LANGUAGE_MODEL_METRIC:
        return
    from compressor.backends import backend_for

    backend = backend_for(model_ref)
    fitting = recipes_for(backend)
    raise RecipeError(
        f"recipe {recipe.name!r} is a language-model recipe (validated by perplexity on text); "
        f"this {backend.name} model is not a language model: use a recipe for classifiers, "
        f"regressors and encoders ({', '.join(fitting)}; compress recipes list)")


def recipes_for(backend: Any) -> list[str]:
    """The built-in recipes an array model of `backend`'s kind can run: not a language-model
    recipe, and no training step where the kind has no training loop."""
    from compressor.backends.base import UserLoopBackend

    trains = isinstance(backend, UserLoopBackend)
    fitting = []
    for name in builtin_names():
        recipe = load_recipe(name)
        if recipe.validation.metric == LANGUAGE_MODEL_METRIC:
            continue
        if trains or not any(step.trains for step in recipe.steps):
            fitting.append(name)
    return fitting

"""Which recipes a plan counts, and how: any recipe (a built-in name, a .yaml file, a Recipe)
is planned from the storage its scheme declares (decoders/storage.py), the same description
the LLM route's exporters quantize by, so a user's own recipe file is planned as exactly as
a built-in one.

A language model's scheme under a recipe: its quantize step's (`ptq` is weight-only for a
language model: core/int8_mode.py), float16 for a precision step, float32 without either.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from compressor.config.recipe import Recipe, load_recipe
from compressor.core.int8_mode import post_training_mode
from compressor.decoders.footprint import Layout, exporter_layout
from compressor.decoders.footprint_gguf import gguf_layout
from compressor.decoders.footprint_tflite import litert_layout
from compressor.decoders.storage import WeightStorage
from compressor.errors import RecipeError, UsageError
from compressor.schemes import FLOAT32, Float16, Scheme, scheme_class

FLOAT_MODEL = "fp32"   # the model as it is (no step): a plan name, not a built-in recipe
DEFAULT_RECIPES = ("fp16", "int8", "int4", "int4_g128")
LM_LAYER_KINDS = frozenset({"causal_lm"})   # what the language-model backend describes


@dataclass(frozen=True)
class PlannedRecipe:
    """A recipe as the plan counts it: its name and the layouts of the files it writes."""

    name: str
    storage: WeightStorage
    onnx: Layout
    tflite: Layout
    gguf: Layout

    @property
    def accuracy_rank(self) -> int:
        return self.onnx.accuracy_rank


def lm_scheme(recipe: Recipe) -> Scheme | None:
    """The scheme a language model is written in under `recipe` (None: a prune or distill step
    changes the model in ways the plan does not count before they run; a training quantize
    step, int4 QAT, stores as its scheme says)."""
    if any(step.kind in ("prune", "distill") or (step.trains and step.kind != "quantize")
           for step in recipe.steps):
        return None
    for step in recipe.steps:
        if step.kind == "precision":
            return Float16.from_step(step)
        if step.kind == "quantize":
            mode = post_training_mode(LM_LAYER_KINDS)[0] if step.mode == "ptq" else step.mode
            return scheme_class(mode, step.dtype).from_step(step)
    return FLOAT32


def planned(recipe: Recipe) -> PlannedRecipe | None:
    """`recipe` as the plan counts it; None when a language model cannot be written in it
    (a prune / distill step, or its scheme declares no storage for language models)."""
    scheme = lm_scheme(recipe)
    storage = None if scheme is None else scheme.storage
    if storage is None:
        return None
    return PlannedRecipe(recipe.name, storage, exporter_layout(recipe.name, storage),
                         litert_layout(recipe.name, storage), gguf_layout(recipe.name, storage))


def resolve(ref: str | Path | Recipe | PlannedRecipe) -> PlannedRecipe:
    """A plan recipe from a built-in name, `fp32`, a recipe .yaml path, or a Recipe; a
    UsageError saying what to give when it names none or cannot be planned."""
    if isinstance(ref, PlannedRecipe):
        return ref
    recipe = ref if isinstance(ref, Recipe) else recipe_of(str(ref))
    found = planned(recipe)
    if found is None:
        scheme = lm_scheme(recipe)
        why = ("a prune or distill step changes the model, which the plan does not count; "
               "plan the recipe's quantize step alone" if scheme is None
               else f"its scheme ({scheme.label}) stores no language model")
        raise UsageError(f"recipe {recipe.name!r} cannot be planned for a language model: {why}; "
                         f"plan {', '.join(DEFAULT_RECIPES)} or a recipe of weight-only / "
                         "float16 steps")
    return found


def recipe_of(ref: str) -> Recipe:
    """The recipe a plan name, built-in name or .yaml path names."""
    if ref == FLOAT_MODEL:
        return Recipe(name=FLOAT_MODEL)
    path = Path(ref)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return load_recipe(path)   # a file's own errors say what is wrong in it
    try:
        return load_recipe(ref)
    except RecipeError:
        raise UsageError(f"unknown plan recipe {ref!r}: give a built-in recipe (compress "
                         f"recipes list), {FLOAT_MODEL}, or a recipe .yaml file") from None

"""Recipes: built-ins validate and round-trip; mistakes give errors that point at the spot."""
from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from compressor.errors import RecipeError
from compressor.config.recipe import builtin_names, load_recipe, recipe_from_dict

EXPECTED_BUILTINS = {"fp16", "int8", "int8_qat", "prune50", "int8_prune30", "int8_prune30_kd",
                     "mixed_int8_fp16", "channels50", "int8_channels50"}


def test_every_design_builtin_is_shipped():
    assert EXPECTED_BUILTINS <= set(builtin_names())


@pytest.mark.parametrize("name", builtin_names())
def test_builtin_validates_and_round_trips_through_yaml(name, tmp_path):
    recipe = load_recipe(name)
    assert recipe.name == name
    path = tmp_path / f"{name}.yaml"
    path.write_text(recipe.to_yaml())
    again = load_recipe(str(path))
    assert again == recipe
    assert again.sha256() == recipe.sha256()


def test_int8_prune30_matches_the_design():
    recipe = load_recipe("int8_prune30")
    prune, quantize = recipe.steps
    assert (prune.kind, prune.sparsity, prune.schedule, prune.epochs) == ("prune", 0.3, "polynomial", 2)
    assert (quantize.kind, quantize.mode, quantize.dtype, quantize.preserve_sparsity) == (
        "quantize", "qat", "int8", True)
    assert recipe.export == ("tflite", "onnx")
    assert recipe.validation.max_drop == 0.01
    assert recipe.target == "jetson-orin-nx-8gb"


def _error(raw: dict) -> str:
    with pytest.raises(RecipeError) as info:
        recipe_from_dict(raw, "mine.yaml")
    return str(info.value)


def test_out_of_range_value_names_the_path_and_the_meaning():
    message = _error({"name": "x", "steps": [{"pass": "prune", "sparsity": 1.5}]})
    assert "mine.yaml: steps.0.sparsity = 1.5" in message
    assert "less than 1" in message and "fraction of weights" in message


def test_unknown_key_suggests_the_right_one():
    message = _error({"name": "x", "steps": [{"pass": "prune", "sparsity": 0.3, "sparsty": 0.3}]})
    assert "steps.0.sparsty: unknown key; did you mean 'sparsity'?" in message


def test_unknown_top_level_key_is_refused():
    assert "exports: unknown key; did you mean 'export'?" in _error({"name": "x", "exports": ["onnx"]})


def test_unknown_pass_suggests_the_closest():
    message = _error({"name": "x", "steps": [{"pass": "prun", "sparsity": 0.3}]})
    assert "steps.0.pass = 'prun' is not a pass; did you mean 'prune'?" in message


def test_cross_step_rules():
    assert "put the prune step before quantize" in _error({"name": "x", "steps": [
        {"pass": "quantize", "mode": "ptq"}, {"pass": "prune", "sparsity": 0.3}]})
    assert "more than one quantize step" in _error({"name": "x", "steps": [
        {"pass": "quantize", "mode": "ptq"}, {"pass": "quantize", "mode": "qat"}]})
    assert "TFLite cannot store bfloat16" in _error({"name": "x", "steps": [
        {"pass": "precision", "dtype": "bfloat16"}]})


def test_unknown_builtin_suggests_closest():
    with pytest.raises(RecipeError, match=r"unknown recipe 'int8_prun30'; did you mean 'int8_prune30'\?"):
        load_recipe("int8_prun30")


def test_extends_replaces_steps_and_merges_mappings(tmp_path):
    child = tmp_path / "child.yaml"
    child.write_text(yaml.safe_dump({"extends": "int8_prune30", "name": "looser",
                                     "validate": {"max_drop": 0.03},
                                     "steps": [{"pass": "prune", "sparsity": 0.5}]}))
    recipe = load_recipe(str(child))
    assert recipe.name == "looser"
    assert [s.kind for s in recipe.steps] == ["prune"] and recipe.steps[0].sparsity == 0.5
    assert recipe.validation.max_drop == 0.03
    assert recipe.validation.metric == "accuracy"   # kept from the parent, key by key
    assert recipe.target == "jetson-orin-nx-8gb"


def test_extends_cycle_is_an_error(tmp_path):
    (tmp_path / "a.yaml").write_text("extends: b.yaml\nname: a\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\nname: b\n")
    with pytest.raises(RecipeError, match="loops back"):
        load_recipe(str(tmp_path / "a.yaml"))


def test_configs_are_immutable():
    step = load_recipe("prune50").steps[0]
    with pytest.raises(ValidationError, match="frozen"):
        step.sparsity = 0.9  # type: ignore[misc]


def test_broken_yaml_is_a_recipe_error(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nsteps: [unclosed\n")
    with pytest.raises(RecipeError, match="not valid YAML"):
        load_recipe(str(path))

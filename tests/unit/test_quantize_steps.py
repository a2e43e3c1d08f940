"""A recipe's quantize step parses straight into its scheme's typed model: a key of another
scheme is an error naming it and the scheme it belongs to, values are checked with their
meaning, and the step round-trips through YAML with its scheme's keys."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from compressor.config.recipe import load_recipe, recipe_from_dict
from compressor.errors import RecipeError


def _error(raw: dict, source: str = "mine.yaml") -> str:
    with pytest.raises(RecipeError) as info:
        recipe_from_dict(raw, source)
    return str(info.value)


def _write(path: Path, raw: dict) -> Path:
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _quantize(**keys) -> dict:
    return {"name": "x", "steps": [{"pass": "quantize", **keys}]}


def test_a_key_of_another_scheme_names_the_key_and_the_scheme_it_belongs_to():
    assert _error(_quantize(mode="ptq", group_size=64)) == (
        "mine.yaml: steps.0.group_size is not a key of int8 ptq steps but of int4 weight_only / "
        "int4 qat ones: remove it, or give that mode and dtype (int8 ptq keys: pass, mode, dtype, "
        "calibration_samples, io_dtype, fallback, fallback_dtype, max_float_layers, "
        "calibration_windows)")
    assert "steps.0.fallback is not a key of int4 weight_only steps but of int8 " in _error(
        _quantize(mode="weight_only", dtype="int4", fallback="auto"))
    # training keys are a training scheme's: qat's
    assert "steps.0.epochs is not a key of int8 ptq steps but of int8 qat / int4 qat ones" in _error(
        _quantize(mode="ptq", epochs=3))


def test_a_typo_in_a_scheme_key_suggests_the_key():
    message = _error(_quantize(mode="weight_only", dtype="int4", group_sise=64))
    assert message == ("mine.yaml: steps.0.group_sise is not a key of int4 weight_only steps; "
                       "did you mean 'group_size'? (their keys: pass, mode, dtype, group_size, "
                       "algorithm, int8_budget, calibration_windows, symmetric)")


def test_scheme_key_values_are_checked_with_their_meaning():
    assert _error(_quantize(mode="weight_only", dtype="int4", group_size=48)).startswith(
        "mine.yaml: steps.0.group_size must be a power of two (16, 32, 64, 128, ...), got 48")
    assert _error(_quantize(mode="weight_only", dtype="int4", algorithm="awq")).startswith(
        "mine.yaml: steps.0.algorithm = 'awq': Input should be 'auto', 'gptq', 'gptq_act_order' or 'rtn' (auto (try")


def test_a_quantize_step_is_its_schemes_model_and_round_trips(tmp_path):
    path = _write(tmp_path / "g64.yaml", _quantize(mode="weight_only", dtype="int4",
                                                   group_size=64, symmetric=False))
    recipe = load_recipe(path)
    (step,) = recipe.steps
    assert (step.group_size, step.symmetric, step.algorithm) == (64, False, "auto")
    assert not hasattr(step, "fallback") and not step.trains
    assert recipe.to_dict()["steps"] == [{"pass": "quantize", "mode": "weight_only", "dtype": "int4",
                                          "group_size": 64, "algorithm": "auto",
                                          "int8_budget": 1.15, "symmetric": False}]
    again = load_recipe(_write(tmp_path / "again.yaml", recipe.to_dict()))
    assert again.steps == recipe.steps and again.sha256() != load_recipe("int4").sha256()

"""compressor/config/recipe.py: loading built-ins and files, `extends`, the size limits, and error
messages that name the file and the key path (`steps.0.sparsity`). Step-order rules are
tested with the step registry, not here."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from compressor.errors import RecipeError
from compressor.config.recipe import (MAX_EXTENDS, MAX_RECIPE_BYTES, MAX_STEPS, builtin_names,
                               load_recipe, recipe_from_dict)


def _error(raw: dict, source: str = "mine.yaml") -> str:
    with pytest.raises(RecipeError) as info:
        recipe_from_dict(raw, source)
    return str(info.value)


def _load_error(ref: str | Path) -> str:
    with pytest.raises(RecipeError) as info:
        load_recipe(str(ref))
    return str(info.value)


def _write(path: Path, raw: dict) -> Path:
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


# ---------------------------------------------------------------------------------- loading

def test_a_builtin_by_name():
    recipe = load_recipe("int8_prune30")
    assert [step.kind for step in recipe.steps] == ["prune", "quantize"]
    prune, quantize = recipe.steps
    assert (prune.sparsity, prune.schedule, prune.epochs) == (0.3, "polynomial", 2)
    assert (quantize.mode, quantize.dtype, quantize.epochs, quantize.preserve_sparsity) == \
        ("qat", "int8", 2, True)
    assert recipe.export == ("tflite", "onnx")
    assert (recipe.validation.metric, recipe.validation.max_drop) == ("accuracy", 0.01)
    assert recipe.target == "jetson-orin-nx-8gb"
    assert "int8_prune30" in builtin_names() and "fp16" in builtin_names()


def test_a_recipe_object_is_returned_as_is():
    recipe = load_recipe("fp16")
    assert load_recipe(recipe) is recipe


def test_a_file_without_a_name_is_named_after_the_file(tmp_path):
    path = _write(tmp_path / "half.yaml", {"steps": [{"pass": "precision", "dtype": "float16"}],
                                          "export": ["onnx"]})
    recipe = load_recipe(path)
    assert recipe.name == "half"
    assert recipe.export == ("onnx",) and recipe.steps[0].dtype == "float16"
    assert recipe.validation.max_drop == 0.01 and recipe.target is None   # the defaults


def test_yaml_round_trip_keeps_the_recipe_and_its_hash(tmp_path):
    recipe = load_recipe("int8_prune30_kd")
    assert [list(step)[0] for step in recipe.to_dict()["steps"]] == ["pass", "pass", "pass"]
    path = tmp_path / "copy.yaml"
    path.write_text(recipe.to_yaml())
    again = load_recipe(path)
    assert again == recipe and again.sha256() == recipe.sha256()
    changed = recipe.model_copy(update={"target": None})
    assert changed.sha256() != recipe.sha256()


@pytest.mark.parametrize("name, teacher, train_data", [
    ("fp16", False, False),           # no fine-tuning, no calibration
    ("int8", False, True),            # ptq calibrates on the training split
    ("int8_prune30", False, True),
    ("int8_prune30_kd", True, True),
])
def test_what_a_builtin_needs(name, teacher, train_data):
    recipe = load_recipe(name)
    assert (recipe.needs_teacher, recipe.needs_train_data) == (teacher, train_data)


# ---------------------------------------------------------------------------------- extends

def test_extends_a_builtin_merges_mappings_and_inherits_steps(tmp_path):
    child = _write(tmp_path / "looser.yaml", {"extends": "int8_prune30",
                                              "validate": {"max_drop": 0.02}})
    recipe = load_recipe(child)
    assert recipe.name == "looser"                         # each file is named after itself
    assert [step.kind for step in recipe.steps] == ["prune", "quantize"]
    assert recipe.validation.max_drop == 0.02
    assert recipe.validation.metric == "accuracy"         # kept from the parent, key by key
    assert recipe.target == "jetson-orin-nx-8gb"


def test_extends_replaces_lists_whole(tmp_path):
    child = _write(tmp_path / "child.yaml", {"extends": "int8_prune30", "export": ["onnx"],
                                             "steps": [{"pass": "prune", "sparsity": 0.5}]})
    recipe = load_recipe(child)
    assert recipe.export == ("onnx",)
    assert [step.kind for step in recipe.steps] == ["prune"] and recipe.steps[0].sparsity == 0.5


def test_extends_chains_through_files(tmp_path):
    base = _write(tmp_path / "base.yaml", {"extends": "fp16", "target": None,
                                           "validate": {"max_drop": 0.05}})
    middle = _write(tmp_path / "middle.yaml", {"extends": str(base), "export": ["onnx"]})
    top = _write(tmp_path / "top.yaml", {"extends": str(middle), "name": "mine",
                                         "validate": {"metric": "fidelity", "min_fidelity": 0.99}})
    recipe = load_recipe(top)
    assert recipe.name == "mine"
    assert [step.kind for step in recipe.steps] == ["precision"]          # from fp16
    assert recipe.export == ("onnx",) and recipe.target is None
    assert (recipe.validation.metric, recipe.validation.min_fidelity, recipe.validation.max_drop) \
        == ("fidelity", 0.99, 0.05)


def test_extends_loop_names_the_chain(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    _write(a, {"extends": str(b)})
    _write(b, {"extends": str(a)})
    assert _load_error(a) == f"{a}: `extends` loops back to itself ({a} -> {b})"


def test_extends_depth_is_limited(tmp_path):
    parent = "fp16"
    for level in range(MAX_EXTENDS + 1):
        parent = str(_write(tmp_path / f"level{level}.yaml", {"extends": parent}))
    assert _load_error(parent) == (f"{parent}: `extends` chain deeper than {MAX_EXTENDS} recipes; "
                                   "inherit from fewer levels")
    # one level less loads
    assert load_recipe(tmp_path / f"level{MAX_EXTENDS - 1}.yaml").steps[0].kind == "precision"


def test_extends_an_unknown_recipe(tmp_path):
    child = _write(tmp_path / "child.yaml", {"extends": "int8_qatt"})
    assert _load_error(child).startswith("unknown recipe 'int8_qatt'; did you mean 'int8_qat'?")


# --------------------------------------------------------------------- finding the recipe

def test_unknown_builtin_lists_a_close_name():
    assert _load_error("int8_prun30") == ("unknown recipe 'int8_prun30'; did you mean "
                                          "'int8_prune30'? (compress recipes list)")


def test_a_missing_yaml_path_lists_the_builtins(tmp_path):
    message = _load_error(tmp_path / "nope.yaml")
    assert message.startswith(f"recipe file {tmp_path / 'nope.yaml'} does not exist; pass a "
                              "built-in name (")
    assert "int8_prune30" in message and message.endswith("or a path to a .yaml file")


@pytest.mark.parametrize("ref", ["", "x" * 300, "bad\0name"])
def test_refs_that_cannot_be_a_recipe(ref):
    message = _load_error(ref)
    assert "is not a recipe name or path (empty, over 255 characters, or a NUL byte)" in message
    assert len(message) < 250                     # a long ref is shortened, not echoed whole


# ---------------------------------------------------------------------------- file problems

def test_broken_yaml_names_the_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nsteps: [unclosed\n")
    message = _load_error(path)
    assert message.startswith(f"{path}: not valid YAML (") and message.endswith("fix the file's syntax")


def test_a_yaml_list_is_not_a_recipe(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- pass: prune\n- pass: quantize\n")
    assert _load_error(path) == f"{path}: a recipe is a YAML mapping with `name` and `steps`"


def test_an_oversized_file_is_refused_before_parsing(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("name: big\ndescription: " + "x" * MAX_RECIPE_BYTES + "\n")
    message = _load_error(path)
    assert message.startswith(f"{path}: {path.stat().st_size:,} bytes; a recipe is at most "
                              f"{MAX_RECIPE_BYTES:,} bytes of YAML")


def test_an_alias_bomb_is_refused(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text("name: bomb\n"
                    "a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n"
                    "b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                    "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
                    "d: [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n")   # 10^4 values expanded
    assert _load_error(path) == (f"{path}: more than 5,000 values (YAML aliases counted "
                                 "expanded); a recipe is a few dozen values")


def test_deep_nesting_is_refused(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text("name: deep\nx: " + "[" * 40 + "]" * 40 + "\n")
    assert "nested more than 32 levels" in _load_error(path)


# --------------------------------------------------------------------------- error messages

def test_out_of_range_value_names_the_path_the_value_and_the_meaning():
    assert _error({"name": "x", "steps": [{"pass": "prune", "sparsity": 1.5}]}) == (
        "mine.yaml: steps.0.sparsity = 1.5: Input should be less than 1 "
        "(the fraction of weights to set to zero, e.g. 0.3)")


def test_the_path_counts_steps_from_zero():
    message = _error({"name": "x", "steps": [{"pass": "precision"},
                                             {"pass": "quantize", "epochs": -1}]})
    assert message.startswith("mine.yaml: steps.1.epochs = -1: Input should be greater than or "
                              "equal to 0")


def test_validate_errors_use_the_recipe_key_name():
    assert _error({"name": "x", "validate": {"max_drop": -1}}) == (
        "mine.yaml: validate.max_drop = -1: Input should be greater than or equal to 0 "
        "(absolute metric drop allowed, e.g. 0.01)")


def test_unknown_step_key_suggests_one_and_lists_the_allowed():
    message = _error({"name": "x", "steps": [{"pass": "prune", "sparsity": 0.3, "epoch": 3}]})
    assert message.startswith("mine.yaml: steps.0.epoch: unknown key; did you mean 'epochs'? "
                              "(allowed here: ")
    allowed = message.removesuffix(")").split("(allowed here: ")[1].split(", ")
    assert {"pass", "sparsity", "epochs", "structure", "target_macs"} <= set(allowed)


def test_unknown_top_level_key_lists_the_recipe_keys():
    assert _error({"name": "x", "stepz": []}) == (
        "mine.yaml: stepz: unknown key; did you mean 'steps'? "
        "(allowed here: name, description, steps, export, validate, target)")


def test_unknown_pass_names_the_step():
    message = _error({"name": "x", "steps": [{"pass": "precision"}, {"pass": "prun"}]})
    assert message.startswith("mine.yaml: steps.1.pass = 'prun' is not a pass; did you mean "
                              "'prune'? (passes: ")


def test_a_steps_own_rule_names_the_step():
    assert _error({"name": "x", "steps": [{"pass": "prune"}]}) == (
        "mine.yaml: steps.0 needs sparsity (the fraction of weights, or with structure: channel "
        "of channels, to remove, e.g. 0.3)")
    assert _error({"name": "x", "steps": [{"pass": "prune", "sparsity": 0.3,
                                           "target_macs": 0.5}]}) == (
        "mine.yaml: steps.0 sets target_macs, which only structure: channel uses; add "
        "`structure: channel` or remove target_macs")


def test_export_and_name_values_are_checked():
    assert _error({"name": "x", "export": ["tflite", "pt"]}) == \
        "mine.yaml: export.1 = 'pt': Input should be 'tflite', 'onnx' or 'gguf'"
    assert _error({"name": ""}) == "mine.yaml: name = '': String should have at least 1 character"


def test_at_most_five_errors_are_listed():
    lines = _error({"name": "x", "steps": [{"pass": "prune", "sparsity": s}
                                           for s in (2, 3, 4, 5, 6, 7, 8)]}).splitlines()
    assert len(lines) == 6
    assert lines[0].startswith("mine.yaml: steps.0.sparsity = 2: ")
    assert lines[4].startswith("mine.yaml: steps.4.sparsity = 6: ")
    assert lines[5] == "mine.yaml: and 2 more errors"


def test_too_many_steps_is_one_short_error():
    steps = [{"pass": "precision"}] * (MAX_STEPS + 1)
    assert _error({"name": "x", "steps": steps}) == \
        f"mine.yaml: {MAX_STEPS + 1} steps; a recipe has at most {MAX_STEPS}"


def test_file_errors_name_the_file(tmp_path):
    path = _write(tmp_path / "bad.yaml", {"steps": [{"pass": "prune", "sparsity": 0}]})
    assert _load_error(path).startswith(f"{path}: steps.0.sparsity = 0: Input should be greater "
                                        "than 0")

"""Any recipe is planned, built-in or a user's file, from the storage its scheme declares:
`compress plan MODEL --recipe FILE`, plan_gate on a Recipe, and the refusals of recipes a
language model cannot be written in."""
from __future__ import annotations

import json

import pytest
import yaml

from compressor.cli import main
from compressor.config.recipe import load_recipe
from compressor.decoders.catalogue import lookup
from compressor.decoders.footprint import exporter_layout, weight_bytes
from compressor.decoders.storage import Grid, WeightStorage
from compressor.errors import DeviceBudgetError, UsageError
from compressor.plan import plan, plan_gate
from compressor.plan.recipes import resolve

NX = "jetson-orin-nx-8gb"


def write_recipe(folder, name, **quantize):
    path = folder / f"{name}.yaml"
    step = {"pass": "quantize", "mode": "weight_only", "dtype": "int4", **quantize}
    path.write_text(yaml.safe_dump({"name": name, "steps": [step], "export": ["onnx"],
                                    "validate": {"metric": "perplexity", "max_increase": 0.5}}))
    return path


def weights(model, recipe, context=4096):
    (only,) = plan(model, NX, context, recipes=[recipe])["plans"]
    return only


def test_a_recipe_file_is_planned_from_its_schemes_storage(tmp_path):
    g64 = write_recipe(tmp_path, "mine_g64", group_size=64)
    mine = weights("llama-3.1-8b", str(g64))
    assert mine["recipe"] == "mine_g64"
    shape = lookup("llama-3.1-8b").shape()
    # the scheme's int8 share (1.15x) fits this board at 4096 with groups of 64
    assert mine["int8_budget"] == 1.15
    expected = exporter_layout("x", WeightStorage.every(Grid(4, 64), mine["int8_budget"]))
    assert mine["weights_bytes"] == weight_bytes(shape, expected, 4096).total
    # between the built-in int4 (groups of 32) and int4_g128: fewer scales per weight
    assert weights("llama-3.1-8b", "int4_g128")["weights_bytes"] < mine["weights_bytes"] < \
        weights("llama-3.1-8b", "int4")["weights_bytes"]
    # the same recipe by its name or as a Recipe: the same plan
    assert weights("llama-3.1-8b", load_recipe(g64)) == mine


def test_zero_points_and_groups_are_counted_as_the_recipe_says(tmp_path):
    symmetric = weights("qwen2.5-0.5b", str(write_recipe(tmp_path, "sym", group_size=32)))
    asymmetric = weights("qwen2.5-0.5b", str(write_recipe(tmp_path, "asym", symmetric=False)))
    assert symmetric["weights_bytes"] == weights("qwen2.5-0.5b", "int4")["weights_bytes"]
    # a 4-bit zero point per group of 32 int4 weights (16 bytes + a 4-byte scale): +2.5%
    grown = asymmetric["weights_bytes"] / symmetric["weights_bytes"] - 1
    assert 0.015 < grown < 0.03
    # the built-in recommendation order: more bits, then smaller groups, then zero points
    assert resolve(str(tmp_path / "asym.yaml")).accuracy_rank > resolve("int4").accuracy_rank


def test_compress_plan_takes_recipe_files(tmp_path, capsys):
    g64 = write_recipe(tmp_path, "mine_g64", group_size=64)
    assert main(["plan", "smollm2-135m", "--recipe", str(g64), "--recipe", "int4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [p["recipe"] for p in out["plans"]] == ["mine_g64", "int4"]
    assert main(["plan", "smollm2-135m", "--recipes", f"fp32,{g64}"]) == 0
    assert "mine_g64" in capsys.readouterr().out


def test_plan_gate_plans_a_users_recipe():
    with pytest.raises(DeviceBudgetError, match="llama-3.1-8b at my_half needs"):
        plan_gate("llama-3.1-8b", load_recipe("fp16").model_copy(update={"name": "my_half"}),
                  NX, 4096)
    fits = plan_gate("smollm2-135m", load_recipe("int4_g128"), NX, 4096)
    assert fits["plans"][0]["recipe"] == "int4_g128" and fits["plans"][0]["fits"]


def test_recipes_a_language_model_cannot_be_written_in_are_refused_by_name(tmp_path, capsys):
    for args, message in [
        (("--recipe", "int8_qat"), "recipe 'int8_qat' cannot be planned for a language model: "
                                   "its scheme (int8 qat) stores no language model"),
        (("--recipe", "lm_prune30_kd"), "a prune or distill step changes the model"),
        (("--recipe", str(tmp_path / "missing.yaml")), "missing.yaml does not exist"),
        (("--recipes", "int5"), "unknown plan recipe 'int5'"),
    ]:
        assert main(["plan", "smollm2-135m", *args]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and message in err, err
    dynamic = tmp_path / "dynamic.yaml"   # int8 with activations quantized at run time
    dynamic.write_text(yaml.safe_dump({"name": "dyn", "steps": [{"pass": "quantize",
                                                                 "mode": "dynamic"}]}))
    with pytest.raises(UsageError, match=r"its scheme \(int8 dynamic\) stores no language model"):
        resolve(str(dynamic))
    assert plan_gate("llama-3.1-8b", "int8_qat", NX, 4096) is None


def test_plan_gate_over_several_boards_judges_each_stage():
    """--devices K: Llama-3.1-8B at int8 does not fit one Orin NX 8GB at 4096 tokens but fits
    two (about 4.8 + 4.6 GiB); Gemma-7B at fp16 does not fit two, naming the stage."""
    with pytest.raises(DeviceBudgetError, match="needs 9.9"):
        plan_gate("llama-3.1-8b", "int8", "jetson-orin-nx-8gb", 4096)
    split = plan_gate("llama-3.1-8b", "int8", "jetson-orin-nx-8gb", 4096, devices=2)["split"]
    assert split["fits"] and [s["first_layer"] for s in split["stages"]] == [0, 17]
    assert all(s["bytes"] < 5.3e9 for s in split["stages"])
    with pytest.raises(DeviceBudgetError, match=r"over 2 boards: layers 0-15 need 11\.30 GB"):
        plan_gate("gemma-7b", "fp16", "jetson-orin-nx-8gb", 4096, devices=2)

"""`compress plan` as a user runs it: the JSON keys docs/language-models.md fixes, the 8B Llama
on a Jetson Orin NX 8GB at 4k (fp16 and int8 do not fit, int4 does, two boards split int8), the table,
the host target, artifacts that are not language models, and plan_gate for `compress`."""
from __future__ import annotations

import json

import pytest

from compressor.cli import main
from compressor.errors import DeviceBudgetError
from compressor.decoders.catalogue import lookup
from compressor.plan import plan, plan_gate

TOP = {"model", "target", "context", "batch", "device", "plans", "recommended"}
PLAN = {"recipe", "weights_bytes", "kv_cache_bytes", "working_bytes", "total_bytes", "fits",
        "headroom_bytes", "decode_tokens_per_s_bound", "max_context"}
SPLIT = {"devices", "recipe", "stages", "link_bytes_per_token", "link_tokens_per_s_bound"}


def run(capsys, *args: str) -> dict:
    assert main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_8b_llama_on_orin_nx_at_4k(cli):
    done = cli("plan", "llama-3.1-8b", "--target", "jetson-orin-nx-8gb", "--context", "4096",
               "--devices", "2", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)                     # exactly one JSON object
    assert set(out) >= TOP | {"split"} and set(out["model"]) >= {"name", "params", "layers", "source"}
    assert set(out["device"]) >= {"usable_bytes", "bandwidth_bytes_per_s"}
    assert all(set(p) >= PLAN for p in out["plans"]) and set(out["split"]) >= SPLIT
    assert all(set(s) == {"first_layer", "last_layer", "bytes"} for s in out["split"]["stages"])
    assert out["model"]["params"] == 8_030_261_248 and out["model"]["layers"] == 32
    assert out["device"]["bandwidth_bytes_per_s"] == 102.4e9
    fits = {p["recipe"]: p["fits"] for p in out["plans"]}
    assert fits == {"fp16": False, "int8": False, "int4": True, "int4_g128": True}
    assert out["recommended"] == "int4" and out["split"]["recipe"] == "int8"
    # int4's int8 share (the recipe's 1.15x) cut to what leaves the board 5% free at 4096
    budgets = {p["recipe"]: p["int8_budget"] for p in out["plans"]}
    assert 1.0 < budgets["int4"] < 1.15 and budgets["int4_g128"] == 1.15
    assert budgets["fp16"] == budgets["int8"] == 1.0
    stages = out["split"]["stages"]
    assert stages[0]["first_layer"] == 0 and stages[-1]["last_layer"] == 31 and len(stages) == 2
    assert all(s["bytes"] <= out["device"]["usable_bytes"] for s in stages)
    assert out["split"]["link_bytes_per_token"] == 4096 * 4


def test_the_table_labels_speeds_as_bounds(capsys):
    assert main(["plan", "llama-3.1-8b", "--devices", "2"]) == 0
    text = capsys.readouterr().out
    assert "recommended: int4" in text and "upper bounds, not predictions" in text
    assert "int8 for the matrices int4 moves most" in text and "int4 up to 1.068x" in text
    assert "split over 2 devices at int8 (fits)" in text and "decode tok/s <=" in text


def test_recipes_kv_dtype_batch_and_all_targets(capsys):
    half = run(capsys, "qwen2.5-0.5b", "--recipes", "int4", "--kv-dtype", "float16")
    quarter = run(capsys, "qwen2.5-0.5b", "--recipes", "int4", "--kv-dtype", "int8", "--batch", "2")
    assert [p["recipe"] for p in half["plans"]] == ["int4"]
    assert half["plans"][0]["kv_cache_bytes"] == 24 * 2 * 2 * 64 * 4096 * 2
    assert quarter["plans"][0]["kv_cache_bytes"] == half["plans"][0]["kv_cache_bytes"]
    every = run(capsys, "smollm2-135m", "--target", "all")
    from compressor.devices import load_profiles
    assert [t["target"] for t in every["targets"]] == list(load_profiles())
    assert all(t["recommended"] == "fp16" for t in every["targets"])


def test_user_mistakes_are_one_error_line(capsys):
    for args, message in [
        (("plan", "llama-3.1-8", "--json"), "did you mean 'llama-3.1-8b'"),
        (("plan", "gemma-2-2b", "--context", "16384"), "beyond gemma-2-2b's max_position_embeddings"),
        (("plan", "smollm2-135m", "--context", "0"), "--context 0: must be at least 1"),
        (("plan", "smollm2-135m", "--recipes", "int3"), "unknown plan recipe 'int3'"),
        (("plan", "smollm2-135m", "--target", "jetson-nx"), "unknown device 'jetson-nx'"),
    ]:
        rc = main(list(args))
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err


def test_the_host_target_is_measured():
    out = plan("smollm2-135m", target="host", context=1024, recipes=["int4"])
    assert out["target"] == "host" and out["device"]["bandwidth_bytes_per_s"] > 1e8
    assert out["plans"][0]["decode_tokens_per_s_bound"] > 0


def test_an_onnx_model_gets_the_weights_and_activations_plan(tmp_path, capsys):
    pytest.importorskip("onnx")
    from runtimes.test_runtimes import build_onnx

    from compressor.runtimes import inspect_artifact
    path = build_onnx(tmp_path / "cnn.onnx")
    out = run(capsys, str(path), "--target", "raspberry-pi-4-4gb")
    info = inspect_artifact(path)
    (only,) = out["plans"]
    assert only["total_bytes"] == info.est_peak_memory_bytes and only["fits"]
    assert only["kv_cache_bytes"] == 0 and only["max_context"] is None
    assert out["device"]["usable_bytes"] == int(4 * 2**30 * 0.6)    # the model_share budget


def test_plan_gate_refuses_what_cannot_fit():
    with pytest.raises(DeviceBudgetError, match=r"llama-3.1-8b at int8 needs 9\.9\d GB .* "
                                                r"jetson-orin-nx-8gb has 7\.30 GB") as e:
        plan_gate("llama-3.1-8b", "int8", "jetson-orin-nx-8gb", 4096)
    assert e.value.exit_code == 4 and "--force-plan" in str(e.value)
    fits = plan_gate("llama-3.1-8b", "int4", "jetson-orin-nx-8gb", 4096)   # fits: its plan
    assert fits["plans"][0]["recipe"] == "int4" and fits["plans"][0]["fits"]
    assert plan_gate("llama-3.1-8b", "int8", None, 4096) is None           # no target
    plan_gate("digits.keras", "int8", "jetson-orin-nx-8gb", 4096)          # not a language model
    plan_gate("pkg.module:build", "int8", "jetson-orin-nx-8gb", 4096)
    plan_gate("llama-3.1-8b", "int8_prune30", "jetson-orin-nx-8gb", 4096)  # not an LLM recipe
    plan_gate({"model_type": "bert", "hidden_size": 8}, "int8", "jetson-orin-nx-8gb")
    with pytest.raises(DeviceBudgetError, match="qwen3 at fp16 needs"):   # a config dict
        plan_gate({**lookup("qwen3-8b").config, "model_type": "qwen3"}, "fp16", "raspberry-pi-5-8gb", 2048)


def test_compress_help_names_plan_and_force_plan(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "compress plan MODEL" in text and "--force-plan" in text

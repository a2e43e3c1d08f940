"""`compress` on causal language models end to end: a tiny Llama trained on the built-in text
(so perplexity means something) through int4 / int8, random-init Qwen2 / Gemma 2 / Phi-3
through int4, every artifact re-scored here in its runtime, and the refusals a user meets."""
from __future__ import annotations

import json

import numpy as np
import pytest

import compressor as cz
import compressor.tasks.lm.metrics as lm_metrics
from compressor.tasks.lm.text_data import TextData
from support.html_checks import check_report_html

pytestmark = pytest.mark.slow


def _compress(cli, model_dir, recipe, out, *extra):
    result = cli("--recipe", recipe, str(model_dir), "--data", "text", "--out", str(out),
                 "--format", "onnx", *extra)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else None
    return result, report


@pytest.fixture(scope="module")
def int4_run(trained_lm_dir, tmp_path_factory):
    from conftest import run_cli

    out = tmp_path_factory.mktemp("int4") / "out"
    return (out, *_compress(run_cli, trained_lm_dir, "int4", out, "--target",
                            "raspberry-pi-5-8gb", "--context", "512"))


@pytest.fixture(scope="module")
def int8_run(trained_lm_dir, tmp_path_factory):
    from conftest import run_cli

    out = tmp_path_factory.mktemp("int8") / "out"
    return (out, *_compress(run_cli, trained_lm_dir, "int8", out))


def test_int4_artifact_is_4bit_within_the_gate_and_generates(int4_run, trained_lm_dir):
    out, result, report = int4_run
    assert result.returncode == 0, result.stderr[-2000:]
    (row,) = report["artifacts"]
    assert row["path"] == "model-onnx" and (out / "model-onnx" / "genai_config.json").is_file()
    baseline = report["baseline"]["perplexity"]
    assert baseline < 120   # the trained model: far below the 512-token vocabulary
    assert row["perplexity_increase"] == pytest.approx(row["perplexity"] / baseline - 1)
    assert 0 <= row["perplexity_increase"] <= report["gate"]["max_increase"] == 0.10
    assert row["top1_agreement"] >= 0.8
    assert 0 < row["greedy_agreement"] <= 1
    assert row["weight_share_at_bits"] >= 0.9 and row["weight_bits"] == 4
    # float32 weights; a toy model's file is half graph, norms and rotary caches
    checkpoint = (trained_lm_dir / "model.safetensors").stat().st_size
    assert row["size_bytes"] < 0.4 * checkpoint
    assert row["decode_tokens_per_s"] > 0 and row["prefill_ms"] > 0 and row["peak_rss_bytes"] > 0
    # 2 layers x (K, V) x 2 KV heads x head_dim 16 x the 512-token context x float32
    assert row["context"] == report["context"] == 512
    assert row["kv_cache_bytes"] == 2 * 2 * 2 * 16 * 512 * 4
    assert report["compress_peak_rss_bytes"] > 0
    page = check_report_html(out)   # perplexity, agreement, KV cache as report.json has them
    assert "llm" in page.sections and "metric" not in page.sections
    assert page.column("llm", "model-onnx", "KV cache") == str(row["kv_cache_bytes"])
    assert report["quantize"]["mode"] == "weight_only"
    # the plan made before any work is recorded (report.html shows it), and its bytes are the
    # written folder's
    (planned,) = report["plan"]["plans"]
    assert planned["recipe"] == "int4" and planned["fits"] and report["plan"]["context"] == 512
    assert "plan" in page.sections
    written = sum(f.stat().st_size for f in (out / "model-onnx").iterdir()
                  if f.name.startswith("model.onnx"))
    # int8 mixed in up to 1.15x is planned at that ceiling (whole matrices: a little below it)
    assert planned["int8_budget"] == 1.15 and written <= planned["weights_bytes"] <= 1.05 * written


def test_int4_keeps_the_candidate_closest_to_float_and_the_file_holds_its_mix(int4_run):
    """auto: GPTQ and rounding, each with and without int8 for its costliest matrices, scored
    by KL from the float model on held-out windows; the ONNX file holds the winner's mix."""
    import onnx

    out, _, report = int4_run
    (candidates,) = report["candidates"]
    assert candidates["step"] == "quantize"
    tried = {t["name"]: t for t in candidates["tried"]}
    assert {"gptq", "rtn"} <= set(tried)
    assert candidates["winner"] == min(tried, key=lambda name: tried[name]["score"])
    winner = tried[candidates["winner"]]["settings"]
    graph = onnx.load(str(out / "model-onnx" / "model.onnx"), load_external_data=False).graph
    bits = {node.name: next(a.i for a in node.attribute if a.name == "bits")
            for node in graph.node if node.op_type == "MatMulNBits"}
    at_8 = sorted(name for name, b in bits.items() if b == 8)
    assert bool(at_8) == bool(winner["int8"]) and set(bits.values()) <= {4, 8}
    for unit in winner["int8"]:
        assert any(_node_of(unit) in name for name in at_8), (unit, at_8)
    (row,) = report["artifacts"]
    assert row["weight_dtypes"].get("int8", 0) > 0 if winner["int8"] else True
    assert row["weight_share_at_bits"] >= 0.95   # int4 + the int8 it chose


def _node_of(unit: str) -> str:
    """The builder's node for a unit: model.layers.1.self_attn.qkv -> /model/layers.1/attn/qkv
    (its qkv_proj), model.layers.0.mlp.gate_up -> .../mlp/gate (and up), the table -> lm_head."""
    if not unit.startswith("model.layers."):
        return "/lm_head/"
    layer, _, rest = unit.removeprefix("model.layers.").partition(".")
    block, _, kind = rest.partition(".")
    return f"/model/layers.{layer}/{'attn' if 'attn' in block else 'mlp'}/{kind.split('_')[0]}"


def test_int4_perplexity_is_what_the_artifact_computes(int4_run, trained_lm_dir):
    """Re-scored here, independently of the run: the artifact's own logits on the same
    held-out windows give the reported perplexity."""
    from transformers import AutoTokenizer

    from compressor.runtimes.lm import open_lm_runtime

    out, _, report = int4_run
    _, evaluation = TextData().windows(AutoTokenizer.from_pretrained(trained_lm_dir))
    outputs = open_lm_runtime(out / "model-onnx", threads=1).predict(evaluation)
    assert lm_metrics.perplexity(outputs) == pytest.approx(report["artifacts"][0]["perplexity"],
                                                           rel=1e-4)


def test_int8_agrees_with_torch_on_95_percent_of_next_tokens(int8_run):
    _, result, report = int8_run
    assert result.returncode == 0, result.stderr[-2000:]
    (row,) = report["artifacts"]
    assert row["top1_agreement"] >= 0.95
    assert abs(row["perplexity_increase"]) <= 0.02
    assert row["weight_bits"] == 8 and row["weight_share_at_bits"] >= 0.9
    assert report["quantize"]["mode"] == "weight_only"


@pytest.mark.parametrize("family", ["qwen2", "gemma2", "phi3"])
def test_int4_of_other_families(family, random_lm_dir, tmp_path):
    result = cz.compress(str(random_lm_dir(family)), recipe="int4", data="text",
                         out_dir=tmp_path / "out", formats=("onnx",), latency=False)
    (row,) = result.report["artifacts"]
    assert result.exit_code == 0, result.report["failures"]
    assert row["weight_share_at_bits"] >= 0.9
    assert abs(row["perplexity_increase"]) <= 0.10
    assert row["top1_agreement"] >= 0.6


def test_python_api_sweeps_llm_recipes_into_one_frame(trained_lm_dir, tmp_path):
    frame = cz.sweep(str(trained_lm_dir), recipes=["int4", "fp16"],
                     data=cz.TextData("text", eval_windows=8), out_dir=tmp_path / "sweep",
                     formats=("onnx",), latency=False)
    by_recipe = {row["recipe"]: row for _, row in frame.iterrows()}
    assert set(by_recipe) == {"int4", "fp16"}
    assert by_recipe["int4"]["size_bytes"] < 0.6 * by_recipe["fp16"]["size_bytes"]
    assert abs(by_recipe["fp16"]["perplexity_increase"]) < 0.01
    assert np.isfinite(frame["perplexity"]).all()
    figure = cz.plot_pareto(frame, x="size_bytes", y="metric_value")
    assert figure.axes


def test_refusals_before_any_work(cli, random_lm_dir, tmp_path):
    out = tmp_path / "out"
    bad_group = tmp_path / "g128.yaml"
    bad_group.write_text("name: g128\nextends: int4\nsteps:\n  - pass: quantize\n"
                         "    mode: weight_only\n    dtype: int4\n    group_size: 128\n")
    for args, fragment in (
            (("--recipe", "int8_qat"), "does not fine-tune language models"),
            (("--recipe", "int4", "--weights", "w.pt"), "--weights is for PyTorch"),
            (("--recipe", str(bad_group)), "group_size 128 does not divide the input width 64"),
            (("--recipe", "int4", "--data", str(tmp_path / "missing.txt")), "missing.txt")):
        result = cli(*args, str(random_lm_dir("llama")), "--out", str(out))
        assert result.returncode == 2, (args, result.stderr[-1500:])
        assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr
        assert fragment in result.stderr, result.stderr
        assert not out.exists()

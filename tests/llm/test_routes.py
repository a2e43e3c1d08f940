"""A family or config a route cannot write is refused from config.json before any work, in one
line naming the route that works; a recipe's default format list loses it with a note."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from compressor.backends.llm.routes import refusals, writable_formats
from compressor.errors import BackendUnavailableError
from support import tiny_lm


def _config(family: str, **overrides) -> dict:
    return tiny_lm.tiny_config(family, 512, **overrides).to_dict()


def test_a_family_without_an_onnx_route_keeps_its_tflite_route():
    config = _config("olmo2")
    assert set(refusals(config, ("onnx", "tflite"))) == {"onnx"}
    kept, note = writable_formats(config, ("tflite", "onnx"), explicit=False)
    assert kept == ("tflite",) and note.startswith("export: onnx skipped: ")
    with pytest.raises(BackendUnavailableError, match="tflite"):
        writable_formats(config, ("onnx",), explicit=True)


@pytest.mark.parametrize("family", ["olmo2", "qwen3_moe", "mixtral", "gpt2", "gpt_neox"])
def test_families_without_an_onnx_route(family):
    """Their ONNX refusal names TFLite, the route that converts them (tests/llm/test_moe.py,
    test_families_tflite.py)."""
    reason = refusals(_config(family), ("onnx", "tflite"))
    assert set(reason) == {"onnx"} and "tflite" in reason["onnx"]


def test_no_route_at_all_is_refused_whatever_the_formats(monkeypatch):
    """A config neither route can run (here: no attention heads for LiteRT, an architecture
    the ONNX builder does not dispatch) is refused even from a recipe's default list."""
    config = {**_config("llama"), "architectures": ["NoSuchForCausalLM"], "num_attention_heads": 0}
    assert set(refusals(config, ("onnx", "tflite"))) == {"onnx", "tflite"}
    with pytest.raises(BackendUnavailableError, match="--format (onnx|tflite): "):
        writable_formats(config, ("tflite", "onnx"), explicit=False)


@pytest.mark.parametrize("family", ["llama", "gemma", "gemma3_text", "granite", "smollm3"])
def test_families_with_both_routes_are_not_refused(family):
    assert refusals(_config(family), ("onnx", "tflite")) == {}


def test_a_head_size_onnxruntime_cannot_run_is_refused_for_onnx_only():
    config = _config("llama", head_dim=8, hidden_size=32)
    assert set(refusals(config, ("onnx", "tflite"))) == {"onnx"}


@pytest.mark.parametrize("family,fmt", [("olmo2", "onnx"), ("qwen3_moe", "onnx")])
def test_the_cli_refuses_before_loading(tmp_path, family, fmt):
    """`compress` on a folder whose config.json has no route for --format: exit 2 in one line,
    within 2 s of compressor's own work (the interpreter's start-up measured apart)."""
    folder = tmp_path / family
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_config(family)))
    began = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import compressor.cli"], check=True, timeout=120)
    start_up = time.perf_counter() - began
    began = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "compressor.cli", str(folder), "--recipe", "int4",
                          "--format", fmt, "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=120)
    seconds = time.perf_counter() - began - start_up
    assert run.returncode == 2, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --format "), run.stderr
    assert "Traceback" not in run.stderr and not (tmp_path / "out").exists()
    assert seconds < 2, seconds


def test_compress_refuses_a_config_that_does_not_match_its_weights(tmp_path, random_lm_dir):
    """Before loading, from the headers: transformers' own refusal ('look at the above
    report!') showed no report."""
    import shutil

    folder = shutil.copytree(random_lm_dir("llama"), tmp_path / "mismatched")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "hidden_size": 128}))
    run = subprocess.run([sys.executable, "-m", "compressor.cli", str(folder), "--recipe", "int8",
                          "--format", "onnx", "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr
    assert "config.json does not match the weights" in run.stderr
    assert "model.embed_tokens.weight" in run.stderr and "[512, 64]" in run.stderr
    assert "Traceback" not in run.stderr and not (tmp_path / "out").exists()

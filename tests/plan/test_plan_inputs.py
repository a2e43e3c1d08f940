"""`compress plan` on the inputs users give it: the default context of a model shorter than 4096
positions, a config.json that does not match its weights, Gemma 1 and a mixture of experts
on the terminal."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from compressor.cli import main
from compressor.decoders.headers import describe
from compressor.decoders.shapes import from_hf_config, param_count
from compressor.errors import ModelLoadError
from compressor.plan import plan
from support import helpers
from support.plan_models import TINY_CONFIGS

# TinyLlama-1.1B's config.json (TinyLlama/TinyLlama-1.1B-Chat-v1.0): 2,048 positions
TINYLLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 32000,
             "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
             "num_attention_heads": 32, "num_key_value_heads": 4,
             "max_position_embeddings": 2048, "tie_word_embeddings": False}


def one_error_line(capsys, *args: str) -> str:
    rc = main(["plan", *args])
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_without_context_a_short_model_is_planned_at_its_own_length(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINYLLAMA))
    assert main(["plan", str(config), "--json", "--recipes", "int4"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["context"] == 2048 and out["plans"][0]["kv_cache_bytes"] == 22 * 2 * 4 * 64 * 2048 * 4
    assert plan(TINYLLAMA, recipes=["int4"])["context"] == 2048
    assert plan("smollm2-135m", recipes=["int4"])["context"] == 4096       # at most 4096
    line = one_error_line(capsys, str(config), "--context", "4096")        # asked for: an error
    assert "--context 4096 is beyond" in line and "give --context 2048 or less" in line


def write_header(path: Path, config: dict) -> Path:
    """A .safetensors file with `config`'s tensors (F32 zeros)."""
    return helpers.safetensors_header(path, from_hf_config(config))


def test_a_config_json_that_does_not_match_its_weights_is_refused(tmp_path, capsys):
    config = TINY_CONFIGS["llama"]                                  # hidden_size 128 ...
    folder = tmp_path / "mismatched"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    write_header(folder / "model.safetensors", {**config, "hidden_size": 64})   # ... tensors 64 wide
    with pytest.raises(ModelLoadError, match=r"config.json does not match the weights: tensor "
                                             r"'model.embed_tokens.weight' is \[512, 64\] in the "
                                             r"checkpoint but config.json makes it \[512, 128\]"):
        describe(folder)
    line = one_error_line(capsys, str(folder))
    assert "config.json does not match the weights" in line and "use the config.json saved" in line
    write_header(folder / "model.safetensors", config)               # the matching weights plan
    assert main(["plan", str(folder), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"]["params"] == 426_624 - 512 * 128


def test_a_counted_family_is_checked_against_its_weights_too(tmp_path, capsys):
    pytest.importorskip("transformers")
    config = {"model_type": "gpt2", "vocab_size": 512, "n_embd": 128, "n_layer": 2, "n_head": 4,
              "n_positions": 256}
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    write_header(folder / "model.safetensors", config)   # Conv1D weights stored [in, out]
    described = describe(folder)                          # names match, shapes agree
    assert described.header_params == param_count(described.shape) == 495_104
    write_header(folder / "model.safetensors", {**config, "n_embd": 64})
    line = one_error_line(capsys, str(folder))
    assert "config.json does not match the weights: tensor 'transformer.wte.weight' is [512, 64]" in line


LEAN_PLAN = """
import contextlib, io, sys
from compressor.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    assert main(["plan", "gemma-7b"]) == 0
print(",".join(m for m in ("torch", "transformers") if m in sys.modules))
"""


def test_planning_a_standard_family_imports_no_framework():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", LEAN_PLAN], capture_output=True, text=True,
                          check=True, timeout=120)
    assert done.stdout.strip() == ""


def test_gemma_7b_on_the_orin_nx(capsys):
    assert main(["plan", "gemma-7b", "--target", "jetson-orin-nx-8gb"]) == 0
    text = capsys.readouterr().out
    assert "gemma-7b: 8,537,680,896 params, 28 layers" in text and "active" not in text
    out = plan("gemma-7b", "jetson-orin-nx-8gb")
    assert out["model"]["active_params"] == out["model"]["params"] == 8_537_680_896
    assert out["model"]["family"] == "gemma" and out["context"] == 4096


def test_a_mixture_of_experts_shows_total_and_active_parameters(capsys):
    pytest.importorskip("transformers")
    assert main(["plan", "qwen3-30b-a3b", "--recipes", "int4"]) == 0
    text = capsys.readouterr().out
    assert "30,532,122,624 params (3,353,032,704 active per token" in text
    out = plan("qwen3-30b-a3b", recipes=["int4"])
    assert out["model"]["active_params"] == 3_353_032_704
    (int4,) = out["plans"]
    # every expert is stored (the weights), yet decode reads ~a tenth of them per token: the
    # bound sits far above that of a dense model of the same bytes
    dense_bound = out["device"]["bandwidth_bytes_per_s"] / (int4["weights_bytes"] + int4["kv_cache_bytes"])
    assert int4["weights_bytes"] > 15e9 and int4["decode_tokens_per_s_bound"] > 4 * dense_bound

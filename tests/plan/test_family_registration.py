"""A decoder family added from outside the package by registration alone: one declarative
entry, registered here, for a toy dense decoder (three norms per layer, q/k norms, q/k/v
biases, tied embeddings by default, head_dim 16, every third layer full attention). While it
is registered `compress plan` plans a config.json of it, a checkpoint header without
config.json is recognised as it, and a GGUF header of its architecture maps to it; nothing in
compressor/ names it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from compressor.cli import main
from compressor.decoders.families import Sliding, gguf_family, register_family, unregister_family
from compressor.decoders.headers import describe
from compressor.decoders.shapes import from_hf_config, is_language_model, param_count
from compressor.errors import ModelLoadError
from compressor.plan import plan
from support import helpers

CONFIG = {"model_type": "toy_decoder", "vocab_size": 256, "hidden_size": 64,
          "intermediate_size": 128, "num_hidden_layers": 6, "num_attention_heads": 4,
          "num_key_value_heads": 2, "max_position_embeddings": 8192}


@pytest.fixture
def toy():
    family = register_family(name="toy_decoder", tie_word_embeddings=True, head_dim=16,
                             qkv_bias=True, qk_norm=True, norms_per_layer=3, sliding_window=64,
                             sliding=Sliding(full_every=3))
    yield family
    unregister_family(family.name)


def expected_params() -> int:
    h, inter, q, kv, head = 64, 128, 4 * 16, 2 * 16, 16
    layer = (q * h + 2 * kv * h + h * q) + 3 * inter * h + (q + 2 * kv) + 3 * h + 2 * head
    return 256 * h + 6 * layer + h        # embedding, layers, final norm; lm_head tied


def write_header_only(path: Path, shape) -> Path:
    """A .safetensors file of `shape`'s tensors (F16 zeros), no config.json beside it."""
    return helpers.safetensors_header(path, shape, "F16")


def test_an_unregistered_family_is_refused():
    assert not is_language_model(CONFIG)
    with pytest.raises(ModelLoadError, match="model_type 'toy_decoder' is not a language-model"):
        from_hf_config(CONFIG)


def test_the_entry_decides_the_shape(toy):
    assert is_language_model(CONFIG) and is_language_model({"model_type": "x", "text_config": CONFIG})
    shape = from_hf_config(CONFIG)
    assert (shape.family, shape.head_dim, shape.tie_word_embeddings) == ("toy_decoder", 16, True)
    assert shape.biases == {"q", "k", "v"} and shape.qk_norm and shape.norms_per_layer == 3
    assert shape.layer_windows == (64, 64, None) * 2
    assert param_count(shape) == expected_params()
    assert from_hf_config({**CONFIG, "sliding_window": None}).layer_windows == (None,) * 6


def test_compress_plan_plans_it(toy, tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    assert main(["plan", str(tmp_path / "config.json"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"]["family"] == "toy_decoder" and out["model"]["params"] == expected_params()
    assert out["plans"] and all(p["weights_bytes"] > 0 for p in out["plans"])
    assert plan(CONFIG)["model"]["params"] == expected_params()


def test_its_tensor_names_and_gguf_architecture_say_which_family(toy, tmp_path):
    path = write_header_only(tmp_path / "model.safetensors", from_hf_config(CONFIG))
    described = describe(path)                 # no config.json: shapes from tensor names
    assert described.shape.family == "toy_decoder"
    assert param_count(described.shape) == described.header_params == expected_params()
    assert gguf_family("toy_decoder") is toy


def test_the_footprint_keeps_norms_float32_for_the_families_that_say_so():
    from compressor.decoders.families import registered_families
    from compressor.decoders.footprint import FLOAT32_NORMS

    assert set(FLOAT32_NORMS) == {f.name for f in registered_families() if f.float32_norms}

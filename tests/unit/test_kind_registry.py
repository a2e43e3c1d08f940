"""Model kinds are registry entries (compressor/backends/model_kinds.py): the built-in five keep
their detection order and messages, and a toy kind registered from this module alone is
detected from its references and its objects and gets its backend."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from compressor.backends import framework_of, get_backend, resolve_model
from compressor.backends.model_kinds import (ModelKind, detection_order, register_kind,
                                             registered_kinds, unregister_kind)
from compressor.errors import BackendUnavailableError, ModelLoadError


class ToyModel:
    pass


class ToyBackend:
    name = "toy"
    task = "array"


@pytest.fixture
def toy():
    kind = register_kind(ModelKind(
        name="toy", backend=f"{__name__}:ToyBackend",
        detect_path=lambda path: path.suffix == ".toym",
        detect_object=lambda model: type(model).__name__ == "ToyModel",
        reference_hint=".toym", object_hint="a ToyModel"))
    yield kind
    unregister_kind(kind.name)


def test_the_built_in_kinds_in_their_order():
    assert [k.name for k in registered_kinds()] == ["keras", "torch", "onnx", "saved_model", "llm"]
    assert [k.name for k in detection_order()][0] == "llm"       # refines torch: tried first
    assert {k.name: k.task for k in registered_kinds()}["llm"] == "lm"
    for ref, kind in (("m.keras", "keras"), ("m.h5", "keras"), ("m.pt2", "torch"),
                      ("m.onnx", "onnx"), ("m.gguf", "llm"), ("pkg.mod:build", "torch")):
        assert framework_of(ref) == kind, ref


def test_folders(tmp_path):
    hf, saved = tmp_path / "hf", tmp_path / "saved"
    hf.mkdir()
    saved.mkdir()
    (hf / "config.json").write_text("{}")
    (saved / "saved_model.pb").write_bytes(b"")
    assert framework_of(hf) == "llm" and framework_of(saved) == "saved_model"
    (saved / "keras_metadata.pb").write_bytes(b"")
    assert framework_of(saved) == "keras"
    (saved / "config.json").write_text("{}")      # a SavedModel folder is never a HF folder
    assert framework_of(saved) == "keras"


def test_the_messages(tmp_path):
    (tmp_path / "m.xyz").write_bytes(b"")
    with pytest.raises(ModelLoadError, match=r"unknown model format \.xyz; use \.keras, \.h5, a "
                       r"SavedModel folder, \.pt2, \.onnx, a Hugging Face folder, \.gguf, or "
                       "module:function"):
        framework_of(tmp_path / "m.xyz")
    with pytest.raises(ModelLoadError, match="does not exist; check the path"):
        framework_of(tmp_path / "none.xyz")
    with pytest.raises(ModelLoadError, match=re.escape(
            "cannot compress a ToyModel; pass a tf_keras model, a torch.nn.Module, a "
            "transformers *ForCausalLM model or a (model, tokenizer) pair, or a path to a "
            "model file")):
        framework_of(ToyModel())
    with pytest.raises(BackendUnavailableError, match="no backend named 'x'; use keras, torch, "
                       "onnx, saved_model or llm"):
        get_backend("x")


def test_a_registered_kind_is_detected_and_built(toy, tmp_path):
    assert framework_of("net.toym") == "toy" and framework_of(ToyModel()) == "toy"
    backend, model = resolve_model(str(tmp_path / "net.toym"))
    assert isinstance(backend, ToyBackend) and model == str(tmp_path / "net.toym")
    (tmp_path / "m.xyz").write_bytes(b"")
    with pytest.raises(ModelLoadError, match=r"\.gguf, \.toym, or module:function"):
        framework_of(Path(tmp_path / "m.xyz"))

"""The built-in model kinds (the registry: model_kinds.py). Registration order is the order
errors list them in; the language-model kind refines torch, so it is tried first."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from compressor.backends.model_kinds import ModelKind, is_causal_lm, module_of, register_kind

KERAS_SUFFIXES = (".keras", ".h5", ".hdf5")
TORCH_SUFFIXES = (".pt2", ".pt", ".pth", ".ts")


def _saved_model(path: Path) -> bool:
    return path.is_dir() and (path / "saved_model.pb").exists()


def _keras_file(path: Path) -> bool:
    # tf_keras' SavedModels carry keras_metadata.pb; tf.saved_model.save and Keras 3
    # model.export() write none, and only post-training work is possible on them.
    return path.suffix in KERAS_SUFFIXES or (_saved_model(path)
                                             and (path / "keras_metadata.pb").exists())


def _torch_module(model: Any) -> bool:
    return module_of(model) == "torch" or any(cls.__module__.startswith("torch.nn")
                                              for cls in type(model).__mro__)


def _causal_lm_or_pair(model: Any) -> bool:
    """A transformers causal LM, or the (model, tokenizer) pair `module:function` may return."""
    if isinstance(model, tuple) and len(model) == 2:
        model = model[0]
    return is_causal_lm(model)


def _hf_folder_or_gguf(path: Path) -> bool:
    """A Hugging Face folder (save_pretrained) or a llama.cpp file."""
    return path.suffix == ".gguf" or (path.is_dir() and (path / "config.json").is_file()
                                      and not (path / "saved_model.pb").exists())


register_kind(ModelKind(
    name="keras", backend="compressor.backends.keras:KerasBackend",
    detect_path=_keras_file,
    detect_object=lambda model: module_of(model) in ("tf_keras", "keras", "tensorflow"),
    reference_hint=".keras, .h5, a SavedModel folder", object_hint="a tf_keras model"))

register_kind(ModelKind(
    name="torch", backend="compressor.backends.torch:TorchBackend",
    detect_path=lambda path: path.suffix in TORCH_SUFFIXES, detect_object=_torch_module,
    takes_callables=True, reference_hint=".pt2", object_hint="a torch.nn.Module",
    label="the PyTorch backend", extra="torch"))

register_kind(ModelKind(
    name="onnx", backend="compressor.backends.onnx:OnnxBackend",
    detect_path=lambda path: path.suffix == ".onnx",
    detect_object=lambda model: module_of(model) == "onnx" and type(model).__name__ == "ModelProto",
    reference_hint=".onnx"))

register_kind(ModelKind(
    name="saved_model", backend="compressor.backends.saved_model:SavedModelBackend",
    detect_path=lambda path: _saved_model(path) and not (path / "keras_metadata.pb").exists()))

register_kind(ModelKind(
    name="llm", backend="compressor.backends.llm:LlmBackend", task="lm", refines="torch",
    detect_path=_hf_folder_or_gguf, detect_object=_causal_lm_or_pair,
    reference_hint="a Hugging Face folder, .gguf",
    object_hint="a transformers *ForCausalLM model or a (model, tokenizer) pair",
    label="the language-model backend", extra="llm"))

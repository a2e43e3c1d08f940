"""Picks the backend for a model or a model reference without importing any framework."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from compressor.backends.base import Backend, ModelInfo, UserLoopBackend
from compressor.backends.model_kinds import is_causal_lm
from compressor.errors import BackendUnavailableError, ModelLoadError

__all__ = ["Backend", "ModelInfo", "UserLoopBackend", "backend_for", "framework_of", "get_backend",
           "resolve_model"]

KERAS_SUFFIXES = (".keras", ".h5", ".hdf5")
TORCH_SUFFIXES = (".pt2", ".pt", ".pth", ".ts")


def get_backend(name: str) -> Backend:
    if name == "keras":
        from compressor.backends.keras import KerasBackend

        return KerasBackend()
    if name == "torch":
        try:
            from compressor.backends.torch import TorchBackend
        except ImportError as exc:
            raise BackendUnavailableError(
                f"the PyTorch backend is not available here ({exc}); "
                "install it with `pip install compressor[torch]`") from None
        return TorchBackend()
    if name == "onnx":
        from compressor.backends.onnx import OnnxBackend

        return OnnxBackend()
    if name == "saved_model":
        from compressor.backends.saved_model import SavedModelBackend

        return SavedModelBackend()
    if name == "llm":
        try:
            from compressor.backends.llm import LlmBackend
        except ImportError as exc:
            raise BackendUnavailableError(
                f"the language-model backend is not available here ({exc}); install it with "
                "`pip install compressor[llm]`") from None
        return LlmBackend()
    raise BackendUnavailableError(f"no backend named {name!r}; use keras, torch, onnx, "
                                  "saved_model or llm")


def framework_of(model: Any) -> str:
    """'keras', 'torch', 'onnx', 'saved_model' (a SavedModel without Keras metadata) or 'llm'
    (a causal language model) for a model object or a model reference (path /
    module:function; what a function returns is only known once it ran: resolve_model)."""
    if isinstance(model, (str, Path)):
        return _framework_of_reference(str(model))
    if is_causal_lm(model):
        return "llm"
    module = type(model).__module__.split(".")[0]
    if module in ("tf_keras", "keras", "tensorflow"):
        return "keras"
    if module == "torch" or _is_torch_module(model):
        return "torch"
    if module == "onnx" and type(model).__name__ == "ModelProto":
        return "onnx"
    raise ModelLoadError(f"cannot compress a {type(model).__qualname__}; pass a tf_keras model, "
                         "a torch.nn.Module, or a path to a model file")


def backend_for(model: Any) -> Backend:
    return get_backend(framework_of(model))


def resolve_model(model: Any) -> tuple[Backend, Any]:
    """The backend for `model`, and the model to load: a `module:function` reference is called
    here (once) when it could build a language model, since only its result says whether it
    is one; other references are loaded by their backend as given."""
    kind = framework_of(model)
    if kind == "torch" and isinstance(model, str) and _looks_like_callable_ref(model) \
            and not Path(model).exists():
        from compressor.backends.references import call_reference

        built = call_reference(model)
        lm = built[0] if isinstance(built, tuple) and len(built) == 2 else built
        if is_causal_lm(lm):
            return get_backend("llm"), built
        return get_backend("torch"), built
    return get_backend(kind), model


def _framework_of_reference(ref: str) -> str:
    path = Path(ref)
    if path.suffix == ".gguf" or (path.is_dir() and (path / "config.json").is_file()
                                  and not (path / "saved_model.pb").exists()):
        return "llm"   # a Hugging Face folder (save_pretrained) or a llama.cpp file
    if path.is_dir() and (path / "saved_model.pb").exists():
        # tf_keras' SavedModels carry keras_metadata.pb; tf.saved_model.save and Keras 3
        # model.export() write none, and only post-training work is possible on them.
        return "keras" if (path / "keras_metadata.pb").exists() else "saved_model"
    if path.suffix in KERAS_SUFFIXES:
        return "keras"
    if path.suffix in TORCH_SUFFIXES:
        return "torch"
    if path.suffix == ".onnx":
        return "onnx"
    if _looks_like_callable_ref(ref):
        return "torch"
    if not path.exists():
        raise ModelLoadError(f"model {ref} does not exist; check the path")
    raise ModelLoadError(f"{ref}: unknown model format {path.suffix or '(no suffix)'}; use .keras, "
                         ".h5, a SavedModel folder, .pt2, .onnx, a Hugging Face folder, .gguf, "
                         "or module:function")


def _looks_like_callable_ref(ref: str) -> bool:
    if ":" not in ref or ref.count(":") > 1:
        return False
    module, func = ref.split(":")
    return bool(module) and func.isidentifier()


def _is_torch_module(model: Any) -> bool:
    return any(cls.__module__.startswith("torch.nn") for cls in type(model).__mro__)

"""Picks the backend for a model or a model reference without importing any framework: the
model-kind registry (model_kinds.py; the built-in kinds: kinds.py) says which kind it is."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from compressor.backends import kinds  # noqa: F401  (registers the built-in kinds)
from compressor.backends.base import Backend, ModelInfo, UserLoopBackend
from compressor.backends.model_kinds import (is_callable_ref, kind_named, kind_of_object,
                                             kind_of_reference, make_backend, refined_kind,
                                             registered_kinds)

__all__ = ["Backend", "ModelInfo", "UserLoopBackend", "backend_for", "framework_of", "get_backend",
           "resolve_model"]


def get_backend(name: str) -> Backend:
    return make_backend(name)


def framework_of(model: Any) -> str:
    """The model kind's name ('keras', 'torch', 'onnx', 'saved_model' (a SavedModel without
    Keras metadata), 'llm' (a causal language model), or a registered one) for a model object
    or a model reference (path / module:function; what a function returns is only known once
    it ran: resolve_model)."""
    if isinstance(model, (str, Path)):
        return kind_of_reference(str(model)).name
    return kind_of_object(model).name


def backend_for(model: Any) -> Backend:
    return get_backend(framework_of(model))


def resolve_model(model: Any) -> tuple[Backend, Any]:
    """The backend for `model`, and the model to load: a `module:function` reference is called
    here (once) when what it returns could be of a kind refining the callable's (a language
    model is a torch module), since only its result says which; other references are loaded
    by their backend as given."""
    kind = kind_named(framework_of(model))
    if kind.takes_callables and isinstance(model, str) and is_callable_ref(model) \
            and not Path(model).exists() \
            and any(k.refines == kind.name for k in registered_kinds()):
        from compressor.backends.references import call_reference

        built = call_reference(model)
        first = built[0] if isinstance(built, tuple) and len(built) == 2 else built
        return get_backend(refined_kind(kind, first).name), built
    return get_backend(kind.name), model


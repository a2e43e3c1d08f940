"""The model kinds, one registry: how a model reference (a path, a folder, `module:function`)
or an in-memory object is recognised, which backend serves it (a lazy "module:Class"
reference: nothing is imported until a model of the kind is loaded), what to install when it
is missing, and the task its models serve (compressor/tasks). Detectors read paths and class
names only; they import nothing.

Detection: the kinds that refine another (a causal LM is a torch module with a generation
head) are tried before the rest, then the rest in registration order, first match wins. A
`module:function` reference goes to the kind that takes callables; once called, its result
may turn out to be of a kind that refines it (resolve_model in compressor/backends).
The built-in kinds are registered in compressor/backends/kinds.py.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compressor.errors import BackendUnavailableError, ModelLoadError
from compressor.registry import Registry


@dataclass(frozen=True)
class ModelKind:
    name: str                    # the backend's name: "keras", "torch", ...
    backend: str                 # "module:Class" of its Backend
    task: str = "array"          # the task its models serve (compressor/tasks): "array" | "lm"
    detect_path: Callable[[Path], bool] | None = None    # a reference on disk (need not exist)
    detect_object: Callable[[Any], bool] | None = None   # an in-memory model, by class names
    takes_callables: bool = False   # `module:function` references build models of this kind
    refines: str = ""            # the kind this one is a special case of (tried before it)
    reference_hint: str = ""     # how its references read in "use ..." errors (".keras, .h5")
    object_hint: str = ""        # how its in-memory models read in "pass ..." errors
    label: str = ""              # "the PyTorch backend", for "not available here" errors
    extra: str = ""              # `pip install compressor[extra]` when its import fails;
    #                              "" : an import error is not caught (a broken install)


_KINDS: Registry[ModelKind] = Registry("model kind")


def register_kind(kind: ModelKind) -> ModelKind:
    return _KINDS.add(kind.name, kind)


def unregister_kind(name: str) -> None:
    """Remove a kind (tests that register a toy one)."""
    _KINDS.remove(name)


def registered_kinds() -> tuple[ModelKind, ...]:
    return tuple(_KINDS)


def detection_order() -> tuple[ModelKind, ...]:
    kinds = registered_kinds()
    return tuple(k for k in kinds if k.refines) + tuple(k for k in kinds if not k.refines)


def kind_named(name: str) -> ModelKind:
    if name not in _KINDS:
        names = _KINDS.names()
        raise BackendUnavailableError(f"no backend named {name!r}; use "
                                      f"{', '.join(names[:-1])} or {names[-1]}")
    return _KINDS.get(name)


def make_backend(name: str) -> Any:
    """A new Backend of kind `name`, its module imported now."""
    kind = kind_named(name)
    module, _, cls = kind.backend.partition(":")
    try:
        backend = getattr(importlib.import_module(module), cls)
    except ImportError as exc:
        if not kind.extra:
            raise
        raise BackendUnavailableError(
            f"{kind.label or f'the {name} backend'} is not available here ({exc}); "
            f"install it with `pip install compressor[{kind.extra}]`") from None
    return backend()


def kind_of_object(model: Any) -> ModelKind:
    found = next((k for k in detection_order() if k.detect_object and k.detect_object(model)),
                 None)
    if found is None:
        hints = [k.object_hint for k in registered_kinds() if k.object_hint]
        raise ModelLoadError(f"cannot compress a {type(model).__qualname__}; pass "
                             f"{', '.join(hints)}, or a path to a model file")
    return found


def kind_of_reference(ref: str) -> ModelKind:
    path = Path(ref)
    found = next((k for k in detection_order() if k.detect_path and k.detect_path(path)), None)
    if found is None and is_callable_ref(ref):
        found = next((k for k in detection_order() if k.takes_callables), None)
    if found is not None:
        return found
    if not path.exists():
        raise ModelLoadError(f"model {ref} does not exist; check the path")
    hints = [k.reference_hint for k in registered_kinds() if k.reference_hint]
    if any(k.takes_callables for k in registered_kinds()):
        hints.append("or module:function")
    raise ModelLoadError(f"{ref}: unknown model format {path.suffix or '(no suffix)'}; use "
                         f"{', '.join(hints)}")


def refined_kind(kind: ModelKind, model: Any) -> ModelKind:
    """The kind refining `kind` that `model` (what a `module:function` returned) is, else `kind`."""
    return next((k for k in registered_kinds() if k.refines == kind.name and k.detect_object
                 and k.detect_object(model)), kind)


def is_callable_ref(ref: str) -> bool:
    if ":" not in ref or ref.count(":") > 1:
        return False
    module, func = ref.split(":")
    return bool(module) and func.isidentifier()


# --- detectors: class names only, nothing imported ---------------------------------------

def is_causal_lm(model: Any) -> bool:
    """A transformers model with a generation head."""
    names = {cls.__name__ for cls in type(model).__mro__}
    return {"GenerationMixin", "PreTrainedModel"} <= names


def module_of(model: Any) -> str:
    """The top-level package the model's class comes from ("torch", "tf_keras", ...)."""
    return type(model).__module__.split(".")[0]

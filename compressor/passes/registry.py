"""The pass registry: each pass is a typed config plus one function, registered by decorator.

`passes/__init__.py` imports every pass module explicitly, so importing `compressor.passes`
fills the registry.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from compressor.errors import RecipeError, did_you_mean
from compressor.config.steps import StepConfig, pass_names, step_kind

if TYPE_CHECKING:
    from compressor.backends.base import Backend
    from compressor.core.context import Context, ModelState

# pass(state, config, ctx, backend) -> the new state; the backend does the framework work.
PassFn = Callable[["ModelState", StepConfig, "Context", "Backend"], "ModelState"]
F = TypeVar("F", bound=PassFn)

_PASSES: dict[str, tuple[type[StepConfig], PassFn]] = {}


def register_pass(config_cls: type[StepConfig]) -> Callable[[F], F]:
    """Register `fn` as the pass whose steps are `config_cls` (keyed by its `pass` literal)."""
    name = step_kind(config_cls)

    def decorate(fn: F) -> F:
        if name in _PASSES:
            raise RuntimeError(f"pass {name!r} registered twice")  # a programming error, not user input
        _PASSES[name] = (config_cls, fn)
        return fn

    return decorate


def registered_passes() -> list[str]:
    """The passes registered so far (`compressor.passes` registers one per step config)."""
    return sorted(_PASSES)


def get_pass(name: str) -> PassFn:
    if name not in _PASSES:
        raise RecipeError(f"unknown pass {name!r}{did_you_mean(name, pass_names())}; "
                          f"passes are: {', '.join(pass_names())}")
    return _PASSES[name][1]

"""The pass registry: each pass is a typed config plus one function, registered by decorator.

`passes/__init__.py` imports every pass module explicitly, so importing `compressor.passes`
fills the registry.
"""
from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from compressor.errors import RecipeError
from compressor.steps import StepConfig, step_kind

if TYPE_CHECKING:
    from compressor.backends.base import Backend
    from compressor.context import Context, ModelState

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


def pass_names() -> list[str]:
    return sorted(_PASSES)


def get_pass(name: str) -> PassFn:
    if name not in _PASSES:
        raise RecipeError(f"unknown pass {name!r}{did_you_mean(name, pass_names())}; "
                          f"passes are: {', '.join(pass_names())}")
    return _PASSES[name][1]


def did_you_mean(word: str, choices: list[str]) -> str:
    """'; did you mean 'x'?' for the closest choice, or '' when nothing is close."""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""

"""The pass registry: each pass is a typed config plus one function, registered by decorator.

`passes/__init__.py` imports every pass module explicitly, so importing `compressor.passes`
fills the registry; `recipe.py` builds its discriminated union of step types from it.
"""
from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, TypeVar
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

from compressor.errors import RecipeError

if TYPE_CHECKING:
    from compressor.context import Context, ModelState


class StepConfig(BaseModel):
    """Base of every step config: immutable, and unknown keys are errors."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class TrainingConfig(StepConfig):
    """Keys shared by every step that fine-tunes the model."""

    epochs: int = Field(2, ge=0, description="fine-tuning epochs over the training split")
    lr: float | None = Field(None, gt=0, description="learning rate; the backend default if unset")
    batch_size: int = Field(32, ge=1, description="fine-tuning batch size, e.g. 32")


PassFn = Callable[["ModelState", StepConfig, "Context"], "ModelState"]
F = TypeVar("F", bound=PassFn)

_PASSES: dict[str, tuple[type[StepConfig], PassFn]] = {}


def register_pass(config_cls: type[StepConfig]) -> Callable[[F], F]:
    """Register `fn` as the pass whose steps are `config_cls` (keyed by its `pass` literal)."""
    name = config_cls.model_fields["kind"].default

    def decorate(fn: F) -> F:
        if name in _PASSES:
            raise RuntimeError(f"pass {name!r} registered twice")  # a programming error, not user input
        _PASSES[name] = (config_cls, fn)
        return fn

    return decorate


def pass_names() -> list[str]:
    return sorted(_PASSES)


def step_configs() -> tuple[type[StepConfig], ...]:
    return tuple(cls for cls, _ in _PASSES.values())


def get_pass(name: str) -> PassFn:
    if name not in _PASSES:
        raise RecipeError(f"unknown pass {name!r}{did_you_mean(name, pass_names())}; "
                          f"passes are: {', '.join(pass_names())}")
    return _PASSES[name][1]


def did_you_mean(word: str, choices: list[str]) -> str:
    """'; did you mean 'x'?' for the closest choice, or '' when nothing is close."""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""

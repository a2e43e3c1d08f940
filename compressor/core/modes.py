"""A caller's model comes back in the modes it was given in.

A run puts an in-memory model it does not copy in eval mode (a language model is used
read-only, never copied whole); each module's training flag is given back when the call
ends, however it ends. Duck-typed (anything with `.modules()` whose items carry `.training`;
a `(model, tokenizer)` pair's model), so no framework is imported here.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def training_flags_kept(model: Any) -> Iterator[None]:
    """The body may change `model`'s modules' training flags; they are restored after it."""
    if isinstance(model, tuple) and len(model) == 2:
        model = model[0]
    modules = getattr(model, "modules", None)
    flags = [(module, module.training) for module in modules()
             if isinstance(getattr(module, "training", None), bool)] if callable(modules) else []
    try:
        yield
    finally:
        for module, training in flags:
            module.training = training

"""The handler table: what each model kind does for a scheme, per stage, in one registry
(in the shape of torchao's `quantize_(model, config)` and its handler table).

- An apply handler runs when the quantize / precision step is applied: it returns the state
  the export handlers need (QAT fine-tuned with fake-quant, observers calibrated, a refusal
  of what the model kind cannot do). A scheme with no apply handler for a model kind needs
  nothing before export (the export handler quantizes the float model).
- An export handler writes the artifact of one format and says which tool made it and
  where its ranges came from (`made_by`, reported per artifact).

Lookups walk the scheme's classes: a handler registered for a base class (Int8Scheme)
serves every mode under it, and a new scheme subclassing a built-in one inherits the
built-in handlers it does not replace. Backends register theirs in their own `handlers.py`,
imported by their package; nothing here imports a framework.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from compressor.errors import RecipeError
from compressor.formats import format_names

if TYPE_CHECKING:
    from compressor.schemes.base import Scheme

# Schemes sit below the run's context (core/context.py holds a Scheme), so the state and the
# context are named here, not imported: ModelState and Context of compressor.core.context.
ModelState = Context = Any
# apply(backend, state, scheme, ctx) -> state; export(backend, state, scheme, path, ctx) -> path
ApplyFn = Callable[[Any, ModelState, Any, Context], ModelState]
ExportFn = Callable[[Any, ModelState, Any, Path, Context], Path]
F = TypeVar("F")


@dataclass(frozen=True)
class ExportHandler:
    write: ExportFn
    made_by: str            # the quantizer / converter and the origin of its ranges


_APPLY: dict[tuple[type, str], ApplyFn] = {}
_EXPORT: dict[tuple[type, str, str], ExportHandler] = {}


def apply_handler(scheme: type[Scheme], kind: str) -> Callable[[F], F]:
    """Register `fn(backend, state, scheme, ctx) -> state` for `scheme` on model `kind`."""
    def decorate(fn: F) -> F:
        _register(_APPLY, (scheme, kind), fn)
        return fn
    return decorate


def export_handler(scheme: type[Scheme], kind: str, fmt: str, made_by: str) -> Callable[[F], F]:
    """Register `fn(backend, state, scheme, path, ctx) -> path` writing `fmt` artifacts."""
    def decorate(fn: F) -> F:
        _register(_EXPORT, (scheme, kind, fmt), ExportHandler(fn, made_by))
        return fn
    return decorate


def _register(table: dict, key: tuple, value: Any) -> None:
    if key in table:
        raise RuntimeError(f"handler {key} registered twice")   # a programming error
    table[key] = value


def find_apply(scheme: Scheme, kind: str) -> ApplyFn | None:
    return next((_APPLY[(cls, kind)] for cls in type(scheme).__mro__ if (cls, kind) in _APPLY),
                None)


def find_export(scheme: Scheme, kind: str, fmt: str) -> ExportHandler:
    """The export handler for `scheme` on `kind` in `fmt`; a RecipeError naming the formats
    the kind can write it in otherwise."""
    for cls in type(scheme).__mro__:
        if (cls, kind, fmt) in _EXPORT:
            return _EXPORT[(cls, kind, fmt)]
    formats = sorted({f for cls in type(scheme).__mro__ for (c, k, f) in _EXPORT
                      if c is cls and k == kind})
    fix = (f"export {' and '.join(formats)} (--format {','.join(formats)})" if formats
           else "choose another quantize mode or precision")
    raise RecipeError(f"the {kind} backend cannot write {fmt} files in {scheme.label}; {fix}")


def formats_of(kind: str) -> tuple[str, ...]:
    """The formats any scheme of model `kind` is written to, in the house order (the format
    registry's, compressor/formats)."""
    written = {fmt for (_, k, fmt) in _EXPORT if k == kind}
    house = format_names()
    return tuple(fmt for fmt in house if fmt in written) + tuple(sorted(written - set(house)))


def apply_scheme(backend: Any, state: ModelState, scheme: Scheme, ctx: Context) -> ModelState:
    """`state` set to be written in `scheme`, after the kind's apply handler (if any) ran."""
    state = state.replace(scheme=scheme)
    apply = find_apply(scheme, backend.name)
    return state if apply is None else apply(backend, state, scheme, ctx)

"""What a quantization scheme is: a typed, immutable description of how an artifact stores
its weights (and computes), built from a recipe step, registered by name.

A scheme says nothing about frameworks: the handlers registered for it per model kind and
format (schemes/handlers.py) do the work. Bit width is data (`weight_bits`), so the
read-back gate counts the bytes the artifact holds at the scheme's own width.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from compressor.errors import RecipeError, did_you_mean


@dataclass(frozen=True)
class Scheme:
    """Base of every scheme. Subclasses set the class-level facts and may add fields."""

    name: ClassVar[str]                 # the recipe's quantize `mode` (or the float type)
    dtype: ClassVar[str]                # the step's `dtype` it answers to: int8, int4, float16
    weight_bits: ClassVar[int]          # bits per stored matrix element in the artifact
    integer: ClassVar[bool] = False     # integer weights: the read-back gate applies
    int8_compute: ClassVar[bool] = False   # every conv / dense op must compute in int8
    report_name: ClassVar[str | None] = None   # report.json quantize.mode, when not `name`

    @classmethod
    def from_step(cls, step: Any) -> Scheme:
        """The scheme a recipe step asks for: fields of the same name are copied."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{name: getattr(step, name) for name in names if hasattr(step, name)})

    @property
    def label(self) -> str:
        """How errors and reports name it, e.g. "int8 ptq", "float16"."""
        return self.name if self.name == self.dtype else f"{self.dtype} {self.name}"


_SCHEMES: dict[tuple[str, str], type[Scheme]] = {}


def register_scheme(cls: type[Scheme]) -> type[Scheme]:
    """Make `cls` the scheme a quantize step with `mode: cls.name, dtype: cls.dtype` builds."""
    key = (cls.name, cls.dtype)
    if key in _SCHEMES and _SCHEMES[key] is not cls:
        raise RuntimeError(f"scheme {key} registered twice")   # a programming error
    _SCHEMES[key] = cls
    return cls


def scheme_class(mode: str, dtype: str) -> type[Scheme]:
    """The registered scheme for a quantize step's mode and dtype; RecipeError naming the
    registered ones otherwise."""
    if (mode, dtype) in _SCHEMES:
        return _SCHEMES[(mode, dtype)]
    modes = sorted({m for m, d in _SCHEMES if d == dtype})
    if modes:
        raise RecipeError(f"unknown quantize mode {mode!r} for dtype {dtype}"
                          f"{did_you_mean(mode, modes)}; the modes are: {', '.join(modes)}")
    dtypes = sorted({d for _, d in _SCHEMES})
    raise RecipeError(f"quantize dtype {dtype!r} has no scheme; use one of {', '.join(dtypes)}")


def scheme_of_step(step: Any) -> Scheme:
    """The scheme a quantize step asks for (its mode and dtype, filled from its keys)."""
    return scheme_class(step.mode, step.dtype).from_step(step)


def quantize_modes() -> list[str]:
    return sorted({mode for mode, _ in _SCHEMES})

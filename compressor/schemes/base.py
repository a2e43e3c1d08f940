"""What a quantization scheme is: a typed, immutable description of how an artifact stores
its weights (and computes), registered by name, whose fields are its recipe keys.

A recipe's quantize step parses straight into a scheme: config/steps.py makes one typed step
model per registered scheme from the scheme's fields (`key(...)`: default, meaning, limits),
so a key the scheme does not have is an error naming it. A scheme says nothing about
frameworks: the handlers registered for it per model kind and format (schemes/handlers.py)
do the work. Bit width is data (`weight_bits`), so the read-back gate counts the bytes the
artifact holds at the scheme's own width; `storage` says how a language model's weights are
stored (decoders/storage.py), which the LLM exporters and the planner both read.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from compressor.decoders.storage import WeightStorage
from compressor.errors import RecipeError, did_you_mean


def key(default: Any, description: str, **limits: Any) -> Any:
    """A scheme field that is a recipe key: its default, what it means (shown with errors),
    and its limits for the step model: ge / le / gt / lt, or `check` (a function raising
    ValueError with what is wrong)."""
    return dataclasses.field(default=default, metadata={"description": description, **limits})


@dataclass(frozen=True)
class Scheme:
    """Base of every scheme. Subclasses set the class-level facts and may add fields."""

    name: ClassVar[str]                 # the recipe's quantize `mode` (or the float type)
    dtype: ClassVar[str]                # the step's `dtype` it answers to: int8, int4, float16
    weight_bits: ClassVar[int]          # bits per stored matrix element in the artifact
    integer: ClassVar[bool] = False     # integer weights: the read-back gate applies
    int8_compute: ClassVar[bool] = False   # every conv / dense op must compute in int8
    report_name: ClassVar[str | None] = None   # report.json quantize.mode, when not `name`
    trains: ClassVar[bool] = False      # the step fine-tunes: its model has the training keys

    @classmethod
    def recipe_keys(cls) -> tuple[dataclasses.Field, ...]:
        """The fields a recipe step sets (those declared with `key`)."""
        return tuple(f for f in dataclasses.fields(cls) if "description" in f.metadata)

    @classmethod
    def from_step(cls, step: Any) -> Scheme:
        """The scheme a recipe step asks for: fields of the same name are copied."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{name: getattr(step, name) for name in names if hasattr(step, name)})

    @property
    def storage(self) -> WeightStorage | None:
        """How a language model's weights are stored in this scheme (None: one the language
        model route does not write)."""
        return None

    @property
    def label(self) -> str:
        """How errors and reports name it, e.g. "int8 ptq", "float16"."""
        return self.name if self.name == self.dtype else f"{self.dtype} {self.name}"


_SCHEMES: dict[tuple[str, str], type[Scheme]] = {}


def register_scheme(cls: type[Scheme]) -> type[Scheme]:
    """Make `cls` the scheme a quantize step with `mode: cls.name, dtype: cls.dtype` builds."""
    registry_key = (cls.name, cls.dtype)
    if registry_key in _SCHEMES and _SCHEMES[registry_key] is not cls:
        raise RuntimeError(f"scheme {registry_key} registered twice")   # a programming error
    _SCHEMES[registry_key] = cls
    return cls


def unregister_scheme(cls: type[Scheme]) -> None:
    """Remove `cls` (tests that register a toy one); its handlers stay, unreachable."""
    if _SCHEMES.get((cls.name, cls.dtype)) is cls:
        del _SCHEMES[(cls.name, cls.dtype)]


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


def registered_schemes() -> list[type[Scheme]]:
    """Every registered scheme, in registration order."""
    return list(_SCHEMES.values())


def scheme_of_step(step: Any) -> Scheme:
    """The scheme a quantize step asks for (its mode and dtype, filled from its keys)."""
    return scheme_class(step.mode, step.dtype).from_step(step)


def quantize_modes() -> list[str]:
    return sorted({mode for mode, _ in _SCHEMES})

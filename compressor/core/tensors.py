"""Model inputs and outputs that are one array or several named ones.

A model with one input takes an array; one with several takes a dict name -> array (every array
with the same number of rows), matched to the model's inputs by name, by position when the
names differ. Outputs come back the same way: one array, or a dict name -> array in the model's
output order. Integer arrays (token ids, masks) are never cast to float.

Imports numpy only, so data loading, validation and every backend share it.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from compressor.errors import DataError

Arrays = np.ndarray | dict[str, np.ndarray]


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output: name, shape (batch first, None where dynamic), dtype name."""

    name: str
    shape: tuple[int | None, ...]
    dtype: str

    def describe(self) -> str:
        dims = ", ".join("?" if d is None else str(d) for d in self.shape[1:])
        return f"{self.name} (N, {dims}) {self.dtype}"


def is_named(x: object) -> bool:
    return isinstance(x, Mapping)


def named(x: Arrays, default_name: str = "input") -> dict[str, np.ndarray]:
    """Every array under its name (a single array under `default_name`)."""
    if is_named(x):
        return {str(k): np.asarray(v) for k, v in x.items()}
    return {default_name: np.asarray(x)}


def rows(x: Arrays) -> int:
    """The number of samples (rows) in x, checking that named arrays agree."""
    if not is_named(x):
        return len(x)
    counts = {name: len(a) for name, a in x.items()}
    if len(set(counts.values())) > 1:
        raise DataError(f"the inputs have different numbers of rows {counts}; every input needs "
                        "one row per sample")
    if not counts:
        raise DataError("the data has an empty dict of inputs; give at least one array")
    return next(iter(counts.values()))


def take(x: Arrays, index: slice | np.ndarray | Sequence[int]) -> Arrays:
    """Rows `index` of every array (a slice, or indices)."""
    if is_named(x):
        return {name: np.asarray(a)[index] for name, a in x.items()}
    return np.asarray(x)[index]


def concat(parts: Sequence[Arrays]) -> Arrays:
    """Join batches (arrays, or dicts with the same keys) along the rows."""
    if parts and is_named(parts[0]):
        return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
    return np.concatenate(parts)


def matched(x: Arrays, names: Sequence[str]) -> list[np.ndarray]:
    """One array per name in `names`: by name, else by position when the counts agree."""
    if not is_named(x):
        if len(names) != 1:
            raise DataError(f"the model has {len(names)} inputs ({', '.join(names)}) but the data "
                            "gives one array; pass a dict name -> array (in .npz files "
                            "x_train.<name> / x_val.<name>)")
        return [np.asarray(x)]
    given = list(x)
    if set(names) <= set(given):
        return [np.asarray(x[n]) for n in names]
    if len(given) == len(names):   # other names, same count: the data's order is the model's
        return [np.asarray(x[n]) for n in given]
    raise DataError(f"the model's inputs are {', '.join(names)} but the data has "
                    f"{', '.join(given)}; name the arrays after the model's inputs")


def output_list(outputs: Arrays) -> list[np.ndarray]:
    return list(outputs.values()) if is_named(outputs) else [np.asarray(outputs)]


def select_output(outputs: Arrays, key: str | int | None) -> np.ndarray:
    """The output a metric reads: by name or position, the first when `key` is None."""
    if not is_named(outputs):
        if key not in (None, 0, "output"):
            raise DataError(f"validate.output is {key!r} but the model has one output; remove it")
        return np.asarray(outputs)
    names = list(outputs)
    if key is None:
        return np.asarray(outputs[names[0]])
    if isinstance(key, int):
        if not 0 <= key < len(names):
            raise DataError(f"validate.output is {key} but the model has {len(names)} outputs "
                            f"({', '.join(names)}); use an index below {len(names)} or a name")
        return np.asarray(outputs[names[key]])
    if key not in outputs:
        raise DataError(f"validate.output {key!r} is not an output of the model; its outputs are "
                        f"{', '.join(names)}")
    return np.asarray(outputs[key])


def output_index(outputs: Sequence[TensorSpec], key: str | int | None) -> int:
    """The position of the output `validate.output` names (0 when it names none)."""
    names = [spec.name for spec in outputs]
    if key is None:
        return 0
    if isinstance(key, int):
        if not 0 <= key < max(len(names), 1):
            raise DataError(f"validate.output is {key} but the model has {len(names)} output(s) "
                            f"({', '.join(names)}); use an index below {len(names)} or a name")
        return key
    if key not in names:
        raise DataError(f"validate.output {key!r} is not an output of the model; its outputs are "
                        f"{', '.join(names)}")
    return names.index(key)


def aligned_outputs(outputs: Arrays, reference: Arrays) -> list[tuple[np.ndarray, np.ndarray]]:
    """Pairs (artifact output, original output): by name when both sides name the same
    outputs, else by position."""
    if is_named(outputs) and is_named(reference) and set(outputs) == set(reference):
        return [(np.asarray(outputs[n]), np.asarray(reference[n])) for n in reference]
    got, want = output_list(outputs), output_list(reference)
    if len(got) != len(want):
        raise DataError(f"the artifact gives {len(got)} outputs but the original model "
                        f"{len(want)}; export every output")
    return list(zip(got, want))


def specs_of(x: Arrays, default_name: str = "input") -> tuple[TensorSpec, ...]:
    """Specs of the given arrays (batch dimension dynamic)."""
    return tuple(TensorSpec(name, (None, *a.shape[1:]), a.dtype.name)
                 for name, a in named(x, default_name).items())


def is_integer(dtype: str | np.dtype) -> bool:
    return np.issubdtype(np.dtype(dtype), np.integer) or np.dtype(dtype) == np.bool_

"""Data specs: the built-in `digits`, an `.npz` file, or `module:function` returning data.

Arrays come back laid out for the model's framework (images NHWC for Keras, NCHW for PyTorch)
and are checked against the model's input shape before any work starts. A tf.data.Dataset or
torch DataLoader given for a split is read once into numpy arrays (it must fit in memory).
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import numpy as np

from compressor.core.context import Data
from compressor.core.datasets import digits
from compressor.errors import DataError, first_line
from compressor.core.tensors import TensorSpec, is_integer, specs_of

NPZ_KEYS = ("x_train", "y_train", "x_val", "y_val")


def load_data(spec: Any, layout: str = "NHWC", framework: str | None = None) -> Data:
    """A Data from `digits`, a `.npz` path, `module:function`, a Data, or a dict / tuple of arrays.

    Splits may be tf.data Datasets or torch DataLoaders; with `framework` ("keras" | "torch")
    one of the other framework is refused.
    """
    if isinstance(spec, Data):
        if any(dataset_framework(split) for split in (spec.train, spec.val)):
            return _checked(Data(train=_split(spec.train, framework, f"{spec.name} train"),
                                 val=_split(spec.val, framework, f"{spec.name} val"),
                                 name=spec.name))
        return _checked(spec)
    if isinstance(spec, (str, Path)):
        text = str(spec)
        if text == "digits":
            return digits(layout)
        if text.endswith(".npz") or Path(text).exists():
            return _from_npz(Path(text))
        if ":" in text:
            return _coerce(_call_reference(text), text, framework)
        raise DataError(f"data {text!r} not found; use `digits`, a .npz file with "
                        f"{', '.join(NPZ_KEYS)}, or module:function")
    return _coerce(spec, "data", framework)


def _from_npz(path: Path) -> Data:
    if not path.is_file():
        raise DataError(f"data file {path} does not exist; check the path")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except Exception as exc:   # corrupt input raises zipfile, zlib, format and OS errors
        raise DataError(f"{path}: not a readable .npz file ({first_line(exc, 120)}); save it with "
                        f"numpy.savez(path, {'=..., '.join(NPZ_KEYS)}=...)") from None
    return _coerce(_grouped_inputs(arrays, path), str(path))


def _grouped_inputs(arrays: dict[str, np.ndarray], path: Path) -> dict:
    """`x_train.<name>` / `x_val.<name>` keys become dicts name -> array (several inputs)."""
    grouped: dict = {}
    for key, array in arrays.items():
        split, dot, input_name = key.partition(".")
        if not dot:
            grouped[key] = array
            continue
        if split not in ("x_train", "x_val") or not input_name:
            raise DataError(f"{path}: key {key!r} is not understood; named inputs are "
                            "x_train.<name> and x_val.<name>")
        if split in arrays:
            raise DataError(f"{path}: has both {split} and {key}; give {split} as one array or "
                            f"as {split}.<name> per input, not both")
        grouped.setdefault(split, {})[input_name] = array
    return grouped


def _call_reference(ref: str) -> Any:
    module_name, _, func_name = ref.partition(":")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # like uvicorn: modules in the current directory are found
    try:
        func = getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as exc:
        raise DataError(f"cannot load data from {ref}: {first_line(exc)}; the module must be "
                        "importable from the current directory or PYTHONPATH") from None
    except Exception as exc:   # user code failed at import: report it, keep the cause
        raise DataError(f"importing {module_name} for data failed: {type(exc).__name__}: "
                        f"{first_line(exc)}; fix the module") from exc
    try:
        return func()
    except Exception as exc:   # user code: report it as a data problem, keep the cause
        raise DataError(f"the data function {ref} raised {type(exc).__name__}: "
                        f"{first_line(exc)}; fix the function") from exc


def _coerce(obj: Any, source: str, framework: str | None = None) -> Data:
    """Accepts Data, {"x_train", ...} mappings and ((x, y), (xv, yv)) pairs."""
    if isinstance(obj, Data):
        return _checked(obj)
    if isinstance(obj, dict):
        if "x_val" not in obj:
            raise DataError(f"{source}: needs at least x_val (and x_train, y_train, y_val for "
                            f"fine-tuning and accuracy); it has {', '.join(sorted(obj)) or 'nothing'}")
        train = (obj["x_train"], obj.get("y_train")) if "x_train" in obj else None
        return _checked(Data(train=train, val=(obj["x_val"], obj.get("y_val")), name=source))
    if isinstance(obj, (tuple, list)) and len(obj) == 2:
        return _checked(Data(train=_split(obj[0], framework, f"{source} train"),
                             val=_split(obj[1], framework, f"{source} val"), name=source))
    if dataset_framework(obj):
        raise DataError(f"{source}: one dataset is not enough; pass cz.Data(train=..., val=...) "
                        "or (train, val): the artifacts are validated on the val split")
    raise DataError(f"{source}: expected Data, a dict with {', '.join(NPZ_KEYS)}, or "
                    f"((x_train, y_train), (x_val, y_val)); got {type(obj).__name__}")


def dataset_framework(obj: Any) -> str | None:
    """"keras" for a tf.data.Dataset, "torch" for a torch DataLoader, else None.

    Told by the class's module, so that neither framework is imported to ask.
    """
    for cls in type(obj).__mro__:
        if cls.__name__ == "DataLoader" and cls.__module__.startswith("torch.utils.data"):
            return "torch"
        if cls.__name__ == "DatasetV2" and cls.__module__.startswith("tensorflow.python.data"):
            return "keras"
    return None


def _split(obj: Any, framework: str | None, source: str) -> Any:
    """(x, y) arrays for a split given as arrays, a tf.data.Dataset or a torch DataLoader."""
    if obj is None:
        return None
    found = dataset_framework(obj)
    if found is None:
        return tuple(obj)
    kind = "a tf.data.Dataset" if found == "keras" else "a torch DataLoader"
    if framework in ("keras", "torch") and found != framework:   # onnx models read either
        wanted = "a tf.data.Dataset" if framework == "keras" else "a torch DataLoader"
        raise DataError(f"{source} is {kind}, but the model is a {framework} model; pass "
                        f"{wanted} or numpy arrays (x, y)")
    return _arrays_from_batches(obj, found, f"{source} ({kind})")


def _arrays_from_batches(dataset: Any, framework: str, source: str) -> tuple:
    """Read every element once: (x, y) or (x,) tuples of batches (of single samples when the
    labels are scalars, or the DataLoader has batch_size=None)."""
    elements = dataset.as_numpy_iterator() if framework == "keras" else iter(dataset)
    xs, ys = [], []
    for element in elements:
        parts = element if isinstance(element, (tuple, list)) else (element,)
        if isinstance(element, dict) or not parts:
            raise DataError(f"{source}: elements must be (x, y) or x, got {type(element).__name__}; "
                            "map the dataset to (inputs, labels) tuples")
        xs.append(_numpy(parts[0]))
        ys.append(_numpy(parts[1]) if len(parts) > 1 else None)
    if not xs:
        raise DataError(f"{source} is empty; it must yield at least one batch")
    unbatched = (getattr(dataset, "batch_size", 0) is None
                 or (ys[0] is not None and ys[0].ndim == 0))
    join = np.stack if unbatched else np.concatenate
    return join(xs), (None if ys[0] is None else join(ys))


def _numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):   # a torch tensor, maybe on a GPU or requiring grad
        value = value.detach().cpu()
    return np.asarray(value)


def _checked(data: Data) -> Data:
    """Each split non-empty, numeric and finite, with as many labels as inputs: NaN / Inf in
    the data crash converters natively, far from their cause."""
    for split_name, split in (("train", data.train), ("val", data.val)):
        if split is None:
            continue
        arrays = {f"x_{split_name}": split[0], f"y_{split_name}": split[1]}
        if isinstance(split[0], dict):   # several named inputs
            arrays = {**{f"x_{split_name}.{k}": v for k, v in split[0].items()},
                      f"y_{split_name}": split[1]}
        lengths = {}
        for key, value in arrays.items():
            if value is not None:
                lengths[key] = _check_array(_as_array(value, data.name, key), data.name, key)
        if len(set(lengths.values())) > 1:
            raise DataError(f"{data.name}: {split_name} split has "
                            f"{', '.join(f'{n} {k}' for k, n in lengths.items())} samples; "
                            "inputs and labels must have the same number of samples")
    return data


def _as_array(value: Any, source: str, key: str) -> np.ndarray:
    try:
        return np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise DataError(f"{source}: {key} is not an array ({first_line(exc, 120)}); give "
                        "equally shaped numeric samples") from None


def _check_array(array: np.ndarray, source: str, key: str) -> int:
    """The number of samples in `array`, after refusing empty, non-numeric or non-finite data."""
    if array.ndim == 0 or len(array) == 0:
        raise DataError(f"{source}: {key} has no samples; every split needs at least one")
    if array.dtype.kind not in "biuf":
        raise DataError(f"{source}: {key} holds {array.dtype} values; give numbers (e.g. "
                        f"{key}.astype('float32'))")
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        bad = int(array.size - np.isfinite(array).sum())
        raise DataError(f"{source}: {key} has {bad} NaN or Inf values; clean or drop those "
                        "samples before compressing")
    return len(array)


def check_matches_model(data: Data, inputs: tuple[TensorSpec, ...]) -> None:
    """Raise DataError naming each input whose data has the wrong shape or kind of dtype."""
    for split_name, split in (("val", data.val), ("train", data.train)):
        if split is None:
            continue
        given = specs_of(split[0], inputs[0].name if len(inputs) == 1 else "input")
        if len(given) != len(inputs):
            raise DataError(f"{data.name}: {split_name} has {len(given)} input(s) "
                            f"({', '.join(g.name for g in given)}) but the model takes "
                            f"{len(inputs)}: {'; '.join(s.describe() for s in inputs)}; "
                            "give one array per model input (x_train.<name> in .npz files)")
        by_name = {g.name: g for g in given}
        pairs = [(spec, by_name.get(spec.name)) for spec in inputs]
        if any(got is None for _, got in pairs):
            pairs = list(zip(inputs, given))   # names differ: matched by position
        for spec, got in pairs:
            _check_input(data.name, split_name, spec, got, len(inputs) > 1)


def _check_input(source: str, split_name: str, spec: TensorSpec, got: TensorSpec,
                 several: bool) -> None:
    expected, shape = spec.shape[1:], got.shape[1:]
    label = f"input {spec.name!r}" if several else "inputs"
    if len(expected) != len(shape) or any(e not in (None, g) for e, g in zip(expected, shape)):
        hint = (" (or check the image layout: Keras NHWC, PyTorch NCHW)"
                if len(shape) == 3 and not is_integer(got.dtype) else "")
        raise DataError(f"{source}: {split_name} {label} have shape (N, "
                        f"{', '.join(map(str, shape))}) {got.dtype}, but the model expects "
                        f"{spec.describe()}; reshape the data{hint}")
    if is_integer(spec.dtype) != is_integer(got.dtype):
        raise DataError(f"{source}: {split_name} {label} are {got.dtype}, but the model expects "
                        f"{spec.dtype}; convert them with x.astype('{spec.dtype}')")

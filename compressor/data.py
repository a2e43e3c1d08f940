"""Data specs: the built-in `digits`, an `.npz` file, or `module:function` returning data.

Arrays come back laid out for the model's framework (images NHWC for Keras, NCHW for PyTorch)
and are checked against the model's input shape before any work starts.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import numpy as np

from compressor.context import Data
from compressor.errors import DataError

NPZ_KEYS = ("x_train", "y_train", "x_val", "y_val")


def digits(layout: str = "NHWC") -> Data:
    """sklearn's bundled 8x8 digits: 1347 train / 450 val, images / 16 as float32, labels int64."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x = (bunch.images / 16.0).astype(np.float32)
    y = bunch.target.astype(np.int64)
    x_train, x_val, y_train, y_val = train_test_split(
        x, y, test_size=0.25, random_state=0, stratify=y)
    axis = 1 if layout == "NCHW" else -1
    return Data(train=(np.expand_dims(x_train, axis), y_train),
                val=(np.expand_dims(x_val, axis), y_val), name="digits")


def load_data(spec: Any, layout: str = "NHWC") -> Data:
    """A Data from `digits`, a `.npz` path, `module:function`, a Data, or a dict / tuple of arrays."""
    if isinstance(spec, Data):
        return spec
    if isinstance(spec, (str, Path)):
        text = str(spec)
        if text == "digits":
            return digits(layout)
        if text.endswith(".npz") or Path(text).exists():
            return _from_npz(Path(text))
        if ":" in text:
            return _coerce(_call_reference(text), text)
        raise DataError(f"data {text!r} not found; use `digits`, a .npz file with "
                        f"{', '.join(NPZ_KEYS)}, or module:function")
    return _coerce(spec, "data")


def _from_npz(path: Path) -> Data:
    if not path.is_file():
        raise DataError(f"data file {path} does not exist; check the path")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except (ValueError, OSError, EOFError) as exc:
        raise DataError(f"{path}: not a readable .npz file ({exc}); save it with "
                        f"numpy.savez(path, {'=..., '.join(NPZ_KEYS)}=...)") from None
    return _coerce(arrays, str(path))


def _call_reference(ref: str) -> Any:
    module_name, _, func_name = ref.partition(":")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # like uvicorn: modules in the current directory are found
    try:
        func = getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as exc:
        raise DataError(f"cannot load data from {ref}: {exc}; the module must be importable "
                        "from the current directory or PYTHONPATH") from None
    return func()


def _coerce(obj: Any, source: str) -> Data:
    """Accepts Data, {"x_train", ...} mappings and ((x, y), (xv, yv)) pairs."""
    if isinstance(obj, Data):
        return obj
    if isinstance(obj, dict):
        if "x_val" not in obj:
            raise DataError(f"{source}: needs at least x_val (and x_train, y_train, y_val for "
                            f"fine-tuning and accuracy); it has {', '.join(sorted(obj)) or 'nothing'}")
        train = (obj["x_train"], obj.get("y_train")) if "x_train" in obj else None
        return _checked(Data(train=train, val=(obj["x_val"], obj.get("y_val")), name=source))
    if isinstance(obj, (tuple, list)) and len(obj) == 2:
        return _checked(Data(train=tuple(obj[0]), val=tuple(obj[1]), name=source))
    raise DataError(f"{source}: expected Data, a dict with {', '.join(NPZ_KEYS)}, or "
                    f"((x_train, y_train), (x_val, y_val)); got {type(obj).__name__}")


def _checked(data: Data) -> Data:
    for split_name, split in (("train", data.train), ("val", data.val)):
        if split is None:
            continue
        x, y = np.asarray(split[0]), split[1]
        if y is not None and len(np.asarray(y)) != len(x):
            raise DataError(f"{data.name}: {split_name} has {len(x)} inputs but "
                            f"{len(np.asarray(y))} labels; they must match")
    return data


def check_matches_model(data: Data, input_shape: tuple, input_dtype: str) -> None:
    """Raise DataError when the data cannot be fed to a model with this input."""
    for split_name, split in (("val", data.val), ("train", data.train)):
        if split is None:
            continue
        x = np.asarray(split[0])
        expected = tuple(input_shape[1:])
        got = tuple(x.shape[1:])
        if len(expected) != len(got) or any(e not in (None, g) for e, g in zip(expected, got)):
            raise DataError(
                f"{data.name}: {split_name} inputs have shape {tuple(x.shape)}, but the model "
                f"expects (N, {', '.join('?' if d is None else str(d) for d in expected)}); "
                "reshape the data (or check the image layout: Keras NHWC, PyTorch NCHW)")
        if np.issubdtype(np.dtype(input_dtype), np.floating) != np.issubdtype(x.dtype, np.floating):
            raise DataError(f"{data.name}: {split_name} inputs are {x.dtype}, but the model "
                            f"expects {input_dtype}; convert them with x.astype('{input_dtype}')")

"""`module:function` model references: import the module (or a .py file) and call the function.

Framework-free, so the PyTorch and language-model backends share it (and the session can ask
what a reference builds before picking a backend). User code that fails is a ModelLoadError
that keeps the cause.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from compressor.errors import ModelLoadError, first_line


def is_builder_reference(ref: str) -> bool:
    """`package.module:function` or `path/to/file.py:function`."""
    module_part, sep, function = ref.rpartition(":")
    return bool(sep and module_part and function.isidentifier())


def call_reference(ref: str) -> Any:
    """What the function named by `ref` returns (it runs once)."""
    module_part, _, function_name = ref.rpartition(":")
    from compressor.backends.torch.env import configure_environment

    configure_environment()   # user code imports torch / torchao / transformers: quietly
    module = _import_file(Path(module_part)) if module_part.endswith(".py") else \
        _import_module(module_part, function_name)
    builder = getattr(module, function_name, None)
    if not callable(builder):
        raise ModelLoadError(f"{module_part} has no function {function_name!r}; "
                             f"check the name after the colon in {ref}")
    try:
        return builder()
    except Exception as exc:   # user code: report it as a load problem, keep the cause
        raise ModelLoadError(f"{ref} raised {type(exc).__name__}: {first_line(exc)}") from exc


def _import_module(name: str, function_name: str) -> Any:
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")   # like uvicorn: modules in the current directory are found
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ModelLoadError(f"cannot import {name} ({exc}); the module must be importable from "
                             "the current directory or PYTHONPATH, or give a file: "
                             f"path/to/file.py:{function_name}") from None
    except Exception as exc:   # user code failed at import: a load problem, keep the cause
        raise ModelLoadError(f"importing {name} raised {type(exc).__name__}: "
                             f"{first_line(exc)}; fix the module") from exc


def _import_file(path: Path) -> Any:
    if not path.is_file():
        raise ModelLoadError(f"model code file {path} does not exist; check the path")
    name = f"compressor_user_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module   # dataclasses and pickling look classes up by module name
    try:
        spec.loader.exec_module(module)
    except Exception as exc:   # user code: report it as a load problem, keep the cause
        del sys.modules[name]
        raise ModelLoadError(f"importing {path} raised {type(exc).__name__}: "
                             f"{first_line(exc)}") from exc
    return module

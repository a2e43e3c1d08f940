"""compressor: prune, quantize, distil and export Keras / PyTorch models for edge devices.

    import compressor as cz
    result = cz.compress("model.keras", recipe="int8_prune30", data="digits", out_dir="dist")

Importing this package loads no ML framework, and its public names are resolved on first
use, so `compress --help` starts fast.
"""
from __future__ import annotations

import importlib
from typing import Any

from compressor.errors import (AccuracyGateError, BackendUnavailableError, CompressorError,
                               DataError, DeviceBudgetError, ModelLoadError, RecipeError,
                               UsageError)

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY = {
    "Data": "compressor.core.context",
    "TextData": "compressor.tasks.lm.text_data",
    "Result": "compressor.run.pipeline",
    "compress": "compressor.run.pipeline",
    "prepare": "compressor.run.user_loop",
    "TrainingRun": "compressor.run.user_loop",
    "Recipe": "compressor.config.recipe",
    "load_recipe": "compressor.config.recipe",
    "builtin_names": "compressor.config.recipe",
    "sweep": "compressor.run.sweep",
    "plot_pareto": "compressor.report.pareto",
}

__all__ = [
    "AccuracyGateError", "BackendUnavailableError", "CompressorError", "DataError",
    "DeviceBudgetError", "ModelLoadError", "RecipeError", "UsageError", *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'compressor' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)

"""Checks on the original model's outputs, before any work: finite, labels in range, and
whether the model is better than guessing (a model at chance level passes any drop gate)."""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

from compressor.errors import DataError, ModelLoadError
from compressor.core.tensors import output_list, select_output

CHANCE_MARGIN = 0.05   # a baseline within this of chance is flagged


def check_outputs(reference: Any, data: Any, metric: Any, output: str | int | None = None) -> None:
    """The original model's val outputs are finite; with accuracy, every label names a class
    of the output the metric reads."""
    if any(np.issubdtype(o.dtype, np.number) and not np.isfinite(o).all()
           for o in output_list(reference)):
        raise ModelLoadError("the original model gives NaN or Inf outputs on the val data; its "
                             "weights are probably not finite: retrain or re-export the model")
    classes = _class_count(select_output(reference, output), metric)
    if classes is None:
        return
    for split_name, split in (("val", data.val), ("train", data.train)):
        labels = None if split is None else split[1]
        if labels is None:
            continue
        y = np.asarray(labels)
        if y.dtype.kind not in "iub" and not (y.dtype.kind == "f" and np.all(y == np.round(y))):
            raise DataError(f"{data.name}: y_{split_name} holds non-integer values, but accuracy "
                            "needs class indices; pass integer labels")
        if y.size and (y.min() < 0 or y.max() >= classes):
            raise DataError(f"{data.name}: y_{split_name} has labels from {int(y.min())} to "
                            f"{int(y.max())}, but the model has {classes} classes (0..{classes - 1}); "
                            "fix the labels or pass the matching model")


def chance_level(metric: Any, baseline: float, reference: Any) -> float | None:
    """The accuracy of guessing when `baseline` is no better than it (plus a margin), else None."""
    classes = _class_count(np.asarray(reference), metric)
    if classes is None:
        return None
    chance = 1.0 / classes
    return chance if baseline <= chance + CHANCE_MARGIN else None


def warn_if_chance(metric: Any, baseline: float, reference: Any) -> bool:
    """Print one `warning:` line when the original model scores at chance level; True then."""
    chance = chance_level(metric, baseline, reference)
    if chance is None:
        return False
    print(f"warning: the original model scores {baseline:.4f}, about chance ({chance:.4f}); a "
          "drop gate means little here: check its weights and the labels", file=sys.stderr)
    return True


def _class_count(outputs: np.ndarray, metric: Any) -> int | None:
    if metric != "accuracy" or outputs.ndim != 2 or outputs.shape[1] < 2:
        return None
    return int(outputs.shape[1])

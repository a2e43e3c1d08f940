"""The array task's metrics (accuracy, fidelity, mse, a custom function) and its gate.

Every metric is "higher is better" after `drop()`: accuracy and fidelity drop when they fall,
mse drops when it rises. The original model's outputs are the reference for fidelity and mse.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from compressor.errors import DataError
from compressor.core.tensors import Arrays, aligned_outputs, is_named, select_output

MetricFn = Callable[[np.ndarray, "np.ndarray | None"], float]


def metric_value(metric: str | MetricFn, outputs: Arrays, labels: np.ndarray | None,
                 reference: Arrays, output: str | int | None = None) -> float:
    """The metric of `outputs` given labels and the original model's outputs on the same inputs.

    The artifact's outputs are matched to the original's by name (a runtime's order need not
    be the model's: LiteRT orders them by tensor index). Accuracy, mse and custom metrics read
    one output (`output`, a name or an index into the original's outputs; default the first);
    fidelity is the lowest mean cosine over every output."""
    outputs = in_reference_order(outputs, reference)
    if metric == "fidelity":
        return min(mean_cosine(got, want) for got, want in aligned_outputs(outputs, reference))
    outputs, reference = select_output(outputs, output), select_output(reference, output)
    if callable(metric):
        return float(metric(outputs, labels))
    if metric == "accuracy":
        if labels is None:
            raise DataError("the accuracy metric needs labels (y_val); use `validate: {metric: "
                            "fidelity}` to compare against the original model instead")
        return accuracy(outputs, labels)
    if metric == "mse":
        target = labels if labels is not None and np.size(labels) == np.size(outputs) else reference
        return float(np.mean((outputs.reshape(target.shape).astype(np.float64) - target) ** 2))
    raise DataError(f"unknown metric {metric!r}; use accuracy, fidelity or mse")


def in_reference_order(outputs: Arrays, reference: Arrays) -> Arrays:
    """The artifact's named outputs keyed and ordered as the original model's: by name when
    both name the same outputs, else (other names, same count) by position."""
    if not (is_named(outputs) and is_named(reference)):
        return outputs
    if set(outputs) == set(reference):
        return {name: outputs[name] for name in reference}
    if len(outputs) == len(reference):
        return dict(zip(reference, outputs.values()))
    return outputs


def accuracy(outputs: np.ndarray, labels: np.ndarray) -> float:
    """Top-1 accuracy. One label per sample scores the class axis of an (N, classes) output
    (or (N, 1, ..., classes)); labels shaped like the output less its last axis score every
    position (token accuracy of an LM head's (N, T, vocab) logits against (N, T) labels;
    negative labels, e.g. -100 padding, are left out)."""
    outputs, labels = np.asarray(outputs), np.asarray(labels)
    if labels.ndim >= 1 and outputs.ndim == labels.ndim + 1 and outputs.shape[:-1] == labels.shape:
        scored = labels >= 0
        if not scored.any():
            raise DataError("every y_val label is negative (ignored), so accuracy has nothing to "
                            "score; give class indices >= 0")
        return float(np.mean((np.argmax(outputs, axis=-1) == labels)[scored]))
    positions = int(np.prod(outputs.shape[1:-1])) if outputs.ndim > 2 else 1
    if labels.ndim == 1 and len(labels) == len(outputs) and positions == 1:
        return float(np.mean(np.argmax(outputs.reshape(len(outputs), -1), axis=1) == labels))
    shape = tuple(outputs.shape)
    if labels.ndim == 1 and len(labels) == len(outputs):
        raise DataError(f"accuracy: the output has shape {shape}, {positions} positions of "
                        f"{shape[-1]} classes, but y_val has one label per sample; give labels "
                        f"of shape {shape[:-1]} to score each position, or pick a pooled "
                        "output with validate.output")
    raise DataError(f"accuracy: y_val has shape {tuple(labels.shape)}, but the output has shape "
                    f"{shape}; give one class index per sample ({shape[0]},) or per position "
                    f"{shape[:-1]}")


def mean_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a.reshape(len(a), -1).astype(np.float64)
    b = b.reshape(len(b), -1).astype(np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    cos = np.where(norms > 0, np.sum(a * b, axis=1) / np.maximum(norms, 1e-30), 1.0)
    return float(np.mean(cos))


def drop(metric: str | MetricFn, baseline: float, value: float) -> float:
    """How much worse `value` is than `baseline` (positive = worse)."""
    return value - baseline if metric == "mse" else baseline - value

"""Metrics on exported artifacts, measured in their runtimes, and the accuracy gate.

Every metric is "higher is better" after `drop()`: accuracy and fidelity drop when they fall,
mse drops when it rises. The original model's outputs are the reference for fidelity and mse.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from compressor.errors import DataError
from compressor.steps import ValidateConfig
from compressor.tensors import Arrays, aligned_outputs, select_output, take

MetricFn = Callable[[np.ndarray, "np.ndarray | None"], float]


def metric_value(metric: str | MetricFn, outputs: Arrays, labels: np.ndarray | None,
                 reference: Arrays, output: str | int | None = None) -> float:
    """The metric of `outputs` given labels and the original model's outputs on the same inputs.

    Accuracy, mse and custom metrics read one output (`output`, default the first); fidelity
    is the lowest mean cosine over every output."""
    if metric == "fidelity":
        return min(mean_cosine(got, want) for got, want in aligned_outputs(outputs, reference))
    outputs, reference = select_output(outputs, output), select_output(reference, output)
    if callable(metric):
        return float(metric(outputs, labels))
    if metric == "accuracy":
        if labels is None:
            raise DataError("the accuracy metric needs labels (y_val); use `validate: {metric: "
                            "fidelity}` to compare against the original model instead")
        return float(np.mean(np.argmax(outputs.reshape(len(outputs), -1), axis=1) == labels))
    if metric == "mse":
        target = labels if labels is not None and np.size(labels) == np.size(outputs) else reference
        return float(np.mean((outputs.reshape(target.shape).astype(np.float64) - target) ** 2))
    raise DataError(f"unknown metric {metric!r}; use accuracy, fidelity or mse")


def mean_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a.reshape(len(a), -1).astype(np.float64)
    b = b.reshape(len(b), -1).astype(np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    cos = np.where(norms > 0, np.sum(a * b, axis=1) / np.maximum(norms, 1e-30), 1.0)
    return float(np.mean(cos))


def drop(metric: str | MetricFn, baseline: float, value: float) -> float:
    """How much worse `value` is than `baseline` (positive = worse)."""
    return value - baseline if metric == "mse" else baseline - value


def gate_passes(config: ValidateConfig, metric_value_: float, drop_: float) -> bool:
    if config.metric == "fidelity" and config.min_fidelity is not None:
        return metric_value_ >= config.min_fidelity
    return drop_ <= config.max_drop + 1e-12  # equal counts as passing despite float rounding


def evaluate_artifact(path, data, reference: np.ndarray, baseline: float,
                      config: ValidateConfig, metric: str | MetricFn | None = None,
                      latency: bool = True, threads: int | None = None) -> dict:
    """Run one artifact in its runtime on the val split; the report's per-artifact keys."""
    from compressor.runtimes import inspect_artifact, open_runtime

    metric = metric or config.metric
    info = inspect_artifact(path)
    runtime = open_runtime(path, threads=threads)
    x_val, y_val = data.val
    outputs = runtime.predict(x_val)
    value = metric_value(metric, outputs, y_val, reference, config.output)
    timing = {"p50": None, "p90": None}
    if latency:
        from compressor.runtimes.latency import measure_latency

        timing = measure_latency(path, take(x_val, slice(0, 1)), runtime.threads)
    return {
        "format": info.format, "path": info.path.name,
        "size_bytes": info.size_bytes, "gzip_bytes": info.gzip_bytes, "sha256": info.sha256,
        "metric_value": value, "drop": drop(metric, baseline, value),
        "sparsity": info.sparsity, "weight_dtypes": info.weight_dtypes, "params": info.params,
        "macs": info.macs,
        "latency_ms_p50": timing["p50"], "latency_ms_p90": timing["p90"],
        "threads": runtime.threads, "latency_threads": timing.get("threads"),
        "runtime": runtime.name,
        "est_peak_memory_bytes": info.est_peak_memory_bytes,
    }

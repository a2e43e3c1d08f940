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


MIN_WEIGHT_SHARE = 0.9        # below it an integer artifact fails the gate
MATRIX_ELEMENTS = 1024        # weights this large are matrices / tables quantization must cover
PACKED_DTYPE_BITS = {"int4": 4, "uint4": 4}   # stored two to a byte; numpy has no such dtype


def dtype_bits(dtype: str) -> int:
    """Bits per stored element of a dtype name as artifact inspection reports it."""
    return PACKED_DTYPE_BITS.get(dtype) or np.dtype(dtype).itemsize * 8


def weight_share_at(weights, bits: int) -> tuple[float, list[str]]:
    """The fraction of the weight bytes in an artifact's matrices and tables (tensors of
    >= 1024 elements: kernels, embedding tables, recurrent weights; biases, norms, scales and
    small position tables stay float by design) stored at `bits` bits per element (int4
    packed two to a byte counts as 4), and its largest float tensors ("name (dtype, KB)"),
    which the gate names when the share is too low."""
    sizes = [(w, w.size * dtype_bits(w.dtype) / 8) for w in weights
             if w.size >= MATRIX_ELEMENTS]
    total = sum(size for _, size in sizes)
    if not total:
        return 1.0, []
    at_bits = sum(size for w, size in sizes if dtype_bits(w.dtype) == bits
                  and w.dtype.startswith(("int", "uint")))
    floats = sorted(((size, w) for w, size in sizes if w.dtype.startswith(("float", "bfloat"))),
                    key=lambda pair: -pair[0])
    return at_bits / total, [f"{w.name} ({w.dtype}, {size / 1024:.1f} KB)"
                             for size, w in floats[:3]]


def int8_weight_share(weights) -> tuple[float, list[str]]:
    """`weight_share_at(weights, 8)`: the int8 share report.json has always carried."""
    return weight_share_at(weights, 8)


def drop(metric: str | MetricFn, baseline: float, value: float) -> float:
    """How much worse `value` is than `baseline` (positive = worse)."""
    return value - baseline if metric == "mse" else baseline - value


def gate_passes(config: ValidateConfig, metric_value_: float, drop_: float) -> bool:
    if config.metric == "fidelity" and config.min_fidelity is not None:
        return metric_value_ >= config.min_fidelity
    return drop_ <= config.max_drop + 1e-12  # equal counts as passing despite float rounding


def evaluate_artifact(path, data, reference: np.ndarray, baseline: float,
                      config: ValidateConfig, metric: str | MetricFn | None = None,
                      latency: bool = True, threads: int | None = None,
                      weight_bits: int = 8) -> dict:
    """Run one artifact in its runtime on the val split; the report's per-artifact keys.
    `weight_bits`: the scheme's bit width, whose share of weight bytes the gate reads."""
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
    share, largest_float = weight_share_at(info.weights, weight_bits)
    int8_share = share if weight_bits == 8 else int8_weight_share(info.weights)[0]
    return {
        "int8_weight_share": round(int8_share, 6), "largest_float_weights": largest_float,
        "weight_bits": weight_bits, "weight_share_at_bits": round(share, 6),
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

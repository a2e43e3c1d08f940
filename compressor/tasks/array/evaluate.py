"""An array model's artifact measured in its runtime: the metric on the val split, latency,
and what the file holds (report.json's per-artifact keys)."""
from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import numpy as np

from compressor.config.steps import ValidateConfig
from compressor.core.tensors import Arrays
from compressor.runtimes.weights import int8_weight_share, weight_share_at
from compressor.tasks.array.metrics import MetricFn, drop, metric_value


def evaluate_artifact(path, data, reference: np.ndarray, baseline: float,
                      config: ValidateConfig, metric: str | MetricFn | None = None,
                      latency: bool = True, threads: int | None = None,
                      weight_bits: int = 8, workdir: Path | None = None) -> dict:
    """Run one artifact in its runtime on the val split; the report's per-artifact keys.
    `weight_bits`: the scheme's bit width, whose share of weight bytes the gate reads.

    The runtime runs in a child process (runtimes/isolated.py), the val inputs passed through
    a .npz in `workdir` (a temporary folder when None): a runtime that crashes is a
    RuntimeCrashError for this artifact, and an ONNX file runs at the highest onnxruntime
    optimization level that does not crash (`ort_optimization_level`, `runtime_warning`)."""
    from compressor.runtimes import inspect_artifact
    from compressor.runtimes.weights import largest_tensors
    from compressor.runtimes.isolated import run_isolated

    metric = metric or config.metric
    x_val, y_val = data.val
    info = inspect_artifact(path, sample_shapes(x_val))
    with tempfile.TemporaryDirectory(prefix="compressor-validate-") if workdir is None \
            else contextlib.nullcontext(workdir) as folder:
        run = run_isolated(path, x_val, Path(folder), threads=threads, latency=latency)
    value = metric_value(metric, run.outputs, y_val, reference, config.output)
    timing = run.latency or {"p50": None, "p90": None}
    share, largest_float = weight_share_at(info.weights, weight_bits)
    int8_share = share if weight_bits == 8 else int8_weight_share(info.weights)[0]
    return {
        "int8_weight_share": round(int8_share, 6), "largest_float_weights": largest_float,
        "weight_bits": weight_bits, "weight_share_at_bits": round(share, 6),
        "format": info.format, "path": info.path.name,
        "size_bytes": info.size_bytes, "gzip_bytes": info.gzip_bytes, "sha256": info.sha256,
        "metric_value": value, "drop": drop(metric, baseline, value),
        "sparsity": info.sparsity, "weight_dtypes": info.weight_dtypes, "params": info.params,
        "macs": info.macs, "fixed_batch": info.fixed_batch,
        "latency_ms_p50": timing["p50"], "latency_ms_p90": timing["p90"],
        "threads": run.threads, "latency_threads": timing.get("threads"),
        "runtime": run.runtime, "ort_optimization_level": run.optimization_level,
        "runtime_warning": _lowered_level_warning(info.path.name, run),
        "est_peak_memory_bytes": info.est_peak_memory_bytes,
        "largest_tensors": largest_tensors(info.weights),   # report.html's tensor chart
    }


def sample_shapes(x: Arrays) -> dict[str, tuple[int, ...]]:
    """Input name -> one sample's shape; a single unnamed array is whatever the file calls its
    one input (the key "" matches no name, so both inspectors leave such inputs as declared)."""
    if isinstance(x, dict):
        return {name: tuple(np.shape(values)[1:]) for name, values in x.items()}
    return {"": tuple(np.shape(x)[1:])}


def _lowered_level_warning(name: str, run) -> str | None:
    """What to tell the user when onnxruntime ran the file only at a lower optimization level."""
    if not run.crashed:
        return None
    return (f"{name} crashed {run.runtime} at {'; '.join(run.crashed)}; validated at "
            f"{run.optimization_level}: open it with SessionOptions.graph_optimization_level = "
            f"{run.optimization_level}")

"""Metrics on exported artifacts, measured in their runtimes, and the accuracy gate.

Every metric is "higher is better" after `drop()`: accuracy and fidelity drop when they fall,
mse drops when it rises. The original model's outputs are the reference for fidelity and mse.
"""
from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from compressor.tasks.lm import metrics as lm_metrics
from compressor.errors import DataError
from compressor.config.gate import gate_bound
from compressor.config.steps import ValidateConfig
from compressor.core.tensor_names import short_tensor_name
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
    if metric == "perplexity":
        return lm_metrics.perplexity(outputs)
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
    return at_bits / total, [f"{short_tensor_name(w.name, getattr(w, 'reader', ''))} "
                             f"({w.dtype}, {size / 1024:.1f} KB)" for size, w in floats[:3]]


def int8_weight_share(weights) -> tuple[float, list[str]]:
    """`weight_share_at(weights, 8)`: the int8 share report.json has always carried."""
    return weight_share_at(weights, 8)


def weight_share_text(row: dict, top_only: bool = False) -> str:
    """How the summary table and report.md show an artifact's weights: for an integer scheme
    its share as the gate reads it (weight_share_at: "int8 83.0%"; the element fractions of
    `weight_dtypes` count biases and scales too and read higher), else the dtypes by element."""
    bits = row.get("weight_bits")
    if bits is not None and bits <= 8 and row.get("weight_share_at_bits") is not None:
        return f"int{bits} {row['weight_share_at_bits']:.1%}"
    dtypes = list(row.get("weight_dtypes", {}).items())
    if top_only:
        dtypes = [max(dtypes, key=lambda kv: kv[1], default=("-", 0))]
    return ", ".join(f"{k} {v:.1%}" for k, v in dtypes)


def drop(metric: str | MetricFn, baseline: float, value: float) -> float:
    """How much worse `value` is than `baseline` (positive = worse); perplexity: relative."""
    if metric == "perplexity":
        return lm_metrics.increase(baseline, value)
    return value - baseline if metric == "mse" else baseline - value


def gate_passes(config: ValidateConfig, metric_value_: float, drop_: float) -> bool:
    return gate_bound(config).passes(metric_value_, drop_)


def gate_failure(config: ValidateConfig, row: dict, metric_name: str | None = None) -> str:
    """The failure line of an artifact the gate refused: its number and the bound it missed."""
    return gate_bound(config, metric_name).failure(row["path"], row["metric_value"], row["drop"])


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
    from compressor.report.html.tensors import largest_tensors
    from compressor.runtimes import inspect_artifact
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

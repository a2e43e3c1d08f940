"""What a candidate ONNX file computes beside the float one, in onnxruntime: every output on
each batch, and their mean per-row cosine (onnx_candidates.py scores dynamic int8 files by it)."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np


def run_outputs(path: Path, batches: Sequence[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
    """Every output of `path` on each batch, in onnxruntime."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [value.name for value in session.get_inputs()]
    return [session.run(None, {name: batch[name] for name in names}) for batch in batches]


def mean_cosine(got: list[list[np.ndarray]], want: list[list[np.ndarray]]) -> float:
    """Per-row cosine (each row flattened) of every float output, averaged over rows, then
    over outputs."""
    per_output: dict[int, list[np.ndarray]] = {}
    for got_batch, want_batch in zip(got, want):
        for index, (a, b) in enumerate(zip(got_batch, want_batch)):
            if not np.issubdtype(np.asarray(b).dtype, np.floating):
                continue
            a = np.asarray(a, np.float64).reshape(len(a), -1)
            b = np.asarray(b, np.float64).reshape(len(b), -1)
            norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
            cos = np.where(norms > 0, np.sum(a * b, axis=1) / np.maximum(norms, 1e-30), 1.0)
            per_output.setdefault(index, []).append(cos)
    return float(np.mean([np.concatenate(rows).mean() for rows in per_output.values()]))

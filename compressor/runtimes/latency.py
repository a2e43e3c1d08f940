"""Batch-1 latency measured the way an app runs the artifact: in a fresh process that imports
only the runtime, so no framework thread pool (torch / TensorFlow, still busy or spinning in
the process that trained and exported the model) competes for the cores. Measured in the
`compress` process, PyTorch-route ONNX files timed 3-6x slower than alone.

The fresh process is runtimes/isolated.py's child: validation times latency in the same child
that runs the predictions; `measure_latency` runs one for the timing alone.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from compressor.errors import BackendUnavailableError, CompressorError, first_line
from compressor.core.tensors import take


def measure_latency(path: Path, x_one, threads: int | None = None) -> dict:
    """{"p50", "p90" (ms), "threads", "frameworks" (those loaded in the child: none)} of
    `path` on one sample, timed in a clean subprocess."""
    from compressor.runtimes.isolated import run_isolated

    with tempfile.TemporaryDirectory(prefix="compressor-latency-") as folder:
        try:
            run = run_isolated(path, take(x_one, slice(0, 1)), Path(folder), threads, latency=True)
        except CompressorError as exc:
            raise BackendUnavailableError(f"timing {Path(path).name} in a fresh process failed: "
                                          f"{first_line(exc)}; pass --no-latency to skip the "
                                          "measurement") from None
    return run.latency

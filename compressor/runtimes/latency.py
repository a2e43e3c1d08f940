"""Batch-1 latency measured the way an app runs the artifact: in a fresh process that imports
only the runtime, so no framework thread pool (torch / TensorFlow, still busy or spinning in
the process that trained and exported the model) competes for the cores. Measured in the
`compress` process, PyTorch-route ONNX files timed 3-6x slower than alone.

    python -m compressor.runtimes.latency ARTIFACT INPUTS.npz THREADS   -> one JSON line
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from compressor.errors import BackendUnavailableError
from compressor.runtimes.common import default_threads

SINGLE_INPUT = "__single__"
FRAMEWORKS = ("torch", "tensorflow", "tf_keras", "jax")   # must not be loaded in the child


def measure_latency(path: Path, x_one, threads: int | None = None) -> dict:
    """{"p50", "p90" (ms), "threads", "frameworks" (those loaded in the child: none)} of
    `path` on one sample, timed in a clean subprocess."""
    threads = default_threads(threads)
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [package_root, os.environ.get("PYTHONPATH")])))
    with tempfile.TemporaryDirectory(prefix="compressor-latency-") as tmp:
        inputs = Path(tmp) / "inputs.npz"
        arrays = {str(k): np.asarray(v)[:1] for k, v in x_one.items()} if isinstance(x_one, dict) \
            else {SINGLE_INPUT: np.asarray(x_one)[:1]}
        np.savez(inputs, **arrays)
        done = subprocess.run([sys.executable, "-m", "compressor.runtimes.latency", str(path),
                               str(inputs), str(threads)], capture_output=True, text=True,
                              env=env, check=False, timeout=600)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise BackendUnavailableError(f"timing {Path(path).name} in a fresh process failed: "
                                      f"{tail}; pass --no-latency to skip the measurement")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> None:
    from compressor.runtimes import open_runtime

    path, inputs, threads = Path(argv[0]), np.load(argv[1]), int(argv[2])
    x_one = inputs[SINGLE_INPUT] if SINGLE_INPUT in inputs.files else \
        {name: inputs[name] for name in inputs.files}
    runtime = open_runtime(path, threads=threads)
    timing = runtime.latency_ms(x_one)
    frameworks = sorted(name for name in FRAMEWORKS if name in sys.modules)
    print(json.dumps({**timing, "threads": runtime.threads, "frameworks": frameworks}))


if __name__ == "__main__":
    main(sys.argv[1:])

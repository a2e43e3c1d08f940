"""What every test that drives passes and backends directly needs: a Context, and a step
applied the way the pipeline applies it (the pass records it in the state)."""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from compressor.core.context import Context, Data, ModelState
from compressor.core.progress import Progress
from compressor.passes.registry import get_pass
from compressor.config.steps import StepConfig


def context(data: Data | None = None, workdir: Path | str = "work", seed: int = 0,
            teacher: Any = None, **gate: Any) -> Context:
    return Context(data=data or Data(), progress=Progress(quiet=True), workdir=Path(workdir),
                   seed=seed, teacher=teacher, **gate)


def apply(backend: Any, state: ModelState, config: StepConfig, ctx: Context) -> ModelState:
    """Run `config`'s pass on `state`, as a recipe step would."""
    import compressor.passes  # noqa: F401  (fills the registry)

    return get_pass(config.kind)(state, config, ctx, backend)


def run_keras_script(script: str, folder: Path, timeout: int) -> None:
    """Run a tf_keras script in a fresh process inside `folder` (its files land there)."""
    import os
    import subprocess
    import sys

    import pytest

    pytest.importorskip("tensorflow")
    pytest.importorskip("tf_keras")
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
           "TMPDIR": str(folder), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", script], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, done.stderr[-3000:]


def built_once(tmp_path_factory: Any, name: str, build: Callable[[Path], Any]) -> Path:
    """`build(path)` run once per test run, under pytest-xdist too: its workers share the run's
    base folder, and a file lock makes the others wait for the first and reuse what it built
    (a trained model costs tens of seconds per worker otherwise)."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent          # the run's folder, above each worker's popen-gwN
    path = root / "built-once" / name
    done = path.parent / f"{path.name}.done"
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path.parent / f"{path.name}.lock")):
        if not done.exists():
            build(path)
            done.touch()
    return path


def safetensors_header(path: Path, shape: Any, dtype: str = "F32") -> Path:
    """A .safetensors file holding every (untied) tensor of `shape` (a decoders ModelShape) as
    zeros of `dtype` (F32 / F16), stored as the checkpoint stores them (Conv1D: [in, out])."""
    import json
    import struct

    from compressor.decoders.shapes import tensor_inventory

    size = {"F32": 4, "F16": 2}[dtype]
    header, offset = {}, 0
    for t in tensor_inventory(shape):
        if not t.tied:
            header[t.name] = {"dtype": dtype, "shape": list(t.stored_shape),
                              "data_offsets": [offset, offset + size * t.numel]}
            offset += size * t.numel
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))
    return path

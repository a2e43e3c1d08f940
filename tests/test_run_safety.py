"""Whole runs as processes: a lock keeps two runs off one --out, kill -9 leaves nothing that
the next run does not remove, SIGTERM cleans up, and the same seed gives the same bytes."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow
# int8 ptq exported to ONNX through TFLite and tf2onnx (the route whose names used to vary).
RECIPE = ("extends: int8\nname: loose_int8\nvalidate: {max_drop: 1.0}\ntarget: null\n"
          "export: [onnx]\nsteps:\n  - {pass: quantize, mode: ptq, calibration_samples: 16}\n")


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    import numpy as np

    from compressor.tasks.array.data import digits

    data = digits()
    path = tmp_path_factory.mktemp("data") / "small.npz"
    np.savez(path, x_train=data.train[0][:64], y_train=data.train[1][:64],
             x_val=data.val[0][:64], y_val=data.val[1][:64])
    return path


def _start(args, tmp_path, **popen):
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "compressor.cli", *args, "--no-latency", "-q"],
                            cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True, **popen)


def _wait_for(predicate, process, timeout=120):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert process.poll() is None, f"the run ended early: {process.stderr.read()}"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _names(tmp_path):
    return sorted(p.name for p in (*tmp_path.iterdir(), *(tmp_path / "tmp").iterdir()))


def test_lock_kill9_sigterm_and_same_seed_bytes(tmp_path, untrained_keras_file, small_data):
    (tmp_path / "loose.yaml").write_text(RECIPE)
    args = ["--recipe", "loose.yaml", str(untrained_keras_file), "--data", str(small_data)]

    # Two runs on one --out: the second is refused, naming the lock; the first succeeds.
    first = _start([*args, "--out", "out"], tmp_path)
    _wait_for(lambda: (tmp_path / ".out.lock").exists(), first)
    second = _start([*args, "--out", "out"], tmp_path)
    assert second.wait(timeout=120) == 2
    error = second.stderr.read()
    assert "in use by another compress run" in error and ".out.lock" in error
    assert first.wait(timeout=600) == 0, first.stderr.read()
    # The untrained model guesses: a warning line, and the report says so.
    assert "warning: the original model scores" in first.stderr.read()
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["baseline"]["chance_level"] is True

    # kill -9 while exporting: its folders stay, and the next run removes them.
    victim = _start([*args, "--out", "again"], tmp_path)
    tag = f"-{victim.pid}-"
    _wait_for(lambda: any(f".again.partial{tag}" in name for name in _names(tmp_path)), victim)
    victim.kill()
    victim.wait()
    assert any(name.startswith(f"compressor-work{tag}") for name in _names(tmp_path))
    rerun = _start([*args, "--out", "again"], tmp_path)
    assert rerun.wait(timeout=600) == 0, rerun.stderr.read()
    assert not [name for name in _names(tmp_path) if tag in name]
    assert not (tmp_path / ".again.lock").exists()

    # Same seed, same bytes (TFLite and the tf2onnx-made int8 ONNX).
    for artifact in ("model.onnx",):
        assert (tmp_path / "out" / artifact).read_bytes() == \
            (tmp_path / "again" / artifact).read_bytes(), artifact
    assert oct((tmp_path / "out").stat().st_mode & 0o777) != oct(0o700)

    # SIGTERM: exit 143, one error line, nothing left behind.
    stopped = _start([*args, "--out", "stopped"], tmp_path)
    _wait_for(lambda: any(name.startswith(f"compressor-work-{stopped.pid}-")
                          for name in _names(tmp_path)), stopped)
    stopped.send_signal(signal.SIGTERM)
    assert stopped.wait(timeout=120) == 128 + signal.SIGTERM
    lines = [line for line in stopped.stderr.read().splitlines() if line.startswith("error:")]
    assert lines == ["error: interrupted by SIGTERM; nothing was written to the output folder"]
    assert _names(tmp_path) == ["again", "loose.yaml", "out", "tmp"]

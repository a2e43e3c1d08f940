"""tflite-runtime fallback: on device images only tflite-runtime (with numpy < 2) is installed.

A small venv with numpy<2 + tflite-runtime 2.14 (no ai-edge-litert, no TensorFlow) is built
once under build/tflite-runtime-venv and reused; a full-int8 digits model is then run there
through compressor.runtimes.tflite. Its predictions must equal LiteRT's in the main
environment (same argmax; outputs equal but for a few one-step int8 rounding differences
between the two XNNPACK versions), and inspecting it there must give the same facts.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from compressor.runtimes import inspect_artifact, open_runtime

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
VENV = REPO / "build" / "tflite-runtime-venv"
# what `pip install compressor` needs for this path, with the device image's runtime and numpy
PACKAGES = ["numpy<2", "tflite-runtime==2.14.0", "pydantic>=2.11", "pyyaml>=6"]
PROBE = ("import importlib.util as u, numpy, tflite_runtime.interpreter, yaml, pydantic; "
         "assert numpy.__version__ < '2' and u.find_spec('ai_edge_litert') is None")

TRAIN_INT8 = textwrap.dedent("""
    import numpy as np, tensorflow as tf, tf_keras as keras
    from compressor.tasks.array.data import digits
    tf.random.set_seed(0)
    tf.config.experimental.enable_op_determinism()
    data = digits("NHWC")
    (x, y), (xv, _) = data.train, data.val
    model = keras.Sequential([keras.layers.Input((8, 8, 1)), keras.layers.Conv2D(8, 3, activation="relu"),
                              keras.layers.Flatten(), keras.layers.Dense(10)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, epochs=2, batch_size=32, verbose=0)
    c = tf.lite.TFLiteConverter.from_keras_model(model)
    c.optimizations = [tf.lite.Optimize.DEFAULT]
    c.representative_dataset = lambda: ([x[i:i + 1]] for i in range(100))
    c.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    c.inference_input_type = c.inference_output_type = tf.int8
    open("int8.tflite", "wb").write(c.convert())
    np.save("x_val.npy", xv)
""")

# Runs inside the small venv, with the repository on PYTHONPATH.
RUN_THERE = textwrap.dedent("""
    import json, sys
    import numpy as np
    from compressor.runtimes.tflite import TFLiteRuntime, _litert, inspect_tflite
    model, x_file, out_file = sys.argv[1:]
    runtime = TFLiteRuntime(model, threads=1)
    np.save(out_file, runtime.predict(np.load(x_file), batch_size=50))
    info = inspect_tflite(model)
    print(json.dumps({"runtime": _litert()[2], "name": runtime.name, "numpy": np.__version__,
                      "litert_loaded": any(m.startswith("ai_edge_litert") for m in sys.modules),
                      "params": info.params, "ops": info.ops, "sparsity": info.sparsity,
                      "weight_dtypes": info.weight_dtypes, "est": info.est_peak_memory_bytes}))
""")


def _venv_python() -> Path:
    return VENV / "bin" / "python"


def _works() -> bool:
    ready = (VENV / ".ready").is_file() and _venv_python().is_file()
    return ready and subprocess.run([str(_venv_python()), "-c", PROBE], capture_output=True,
                                    timeout=120, check=False).returncode == 0


def _build() -> str | None:
    """A fresh venv with PACKAGES; None when built, else why pip could not get them."""
    shutil.rmtree(VENV, ignore_errors=True)
    steps = [[sys.executable, "-m", "venv", str(VENV)],
             [str(_venv_python()), "-m", "pip", "install", "-q", "--disable-pip-version-check", *PACKAGES]]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=600, check=False)
        if done.returncode != 0:
            shutil.rmtree(VENV, ignore_errors=True)
            return (f"cannot build {VENV.relative_to(REPO)} with {PACKAGES} (no network, or no "
                    f"tflite-runtime 2.14 wheel for this Python?): {done.stderr.strip()[-600:]}")
    (VENV / ".ready").write_text("\n".join(PACKAGES) + "\n")
    return None


def _ensure_venv() -> str | None:
    """Reuse the venv if it works, else build it (under a lock, for concurrent test runs).

    Returns None when ready, else the reason pip could not build it (the test then skips).
    """
    VENV.parent.mkdir(exist_ok=True)
    with open(VENV.parent / "tflite-runtime-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _works():
            return None
        problem = _build()
        if problem is None and not _works():
            raise AssertionError(f"{VENV} was built but cannot run: {PROBE}")
        return problem


@pytest.fixture(scope="module")
def venv_build():
    """Builds (or checks) the venv in the background: pip mostly waits on the network, so on a
    clean clone it overlaps with training the model."""
    with ThreadPoolExecutor(1) as pool:
        yield pool.submit(_ensure_venv)


@pytest.fixture(scope="module")
def int8_model(tmp_path_factory) -> Path:
    pytest.importorskip("tensorflow")
    pytest.importorskip("tf_keras")
    folder = tmp_path_factory.mktemp("int8")
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "TMPDIR": str(folder),
           "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", TRAIN_INT8], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return folder / "int8.tflite"


def test_int8_artifact_predicts_the_same_in_tflite_runtime(venv_build, int8_model, tmp_path):
    pytest.importorskip("ai_edge_litert")
    problem = venv_build.result()
    if problem:
        pytest.skip(problem)
    x = np.load(int8_model.parent / "x_val.npy")
    litert = open_runtime(int8_model, threads=1)
    assert litert.name.startswith("ai-edge-litert")
    expected = litert.predict(x, batch_size=50)

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(REPO)          # our fallback code, not an installed copy
    done = subprocess.run([str(_venv_python()), "-c", RUN_THERE, str(int8_model),
                           str(int8_model.parent / "x_val.npy"), str(tmp_path / "y.npy")],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    there = json.loads(done.stdout.strip().splitlines()[-1])
    assert there["runtime"] == there["name"] == "tflite-runtime 2.14.0"
    assert there["numpy"].startswith("1.") and not there["litert_loaded"]

    got = np.load(tmp_path / "y.npy")
    assert got.shape == expected.shape == (450, 10) and got.dtype == np.float32
    # The same int8 outputs, dequantized the same way, except where the two XNNPACK versions
    # round a requantization differently: those few differ by exactly one output step.
    from ai_edge_litert.interpreter import Interpreter

    step = Interpreter(model_path=str(int8_model)).get_output_details()[0]["quantization"][0]
    steps = np.round(np.abs(got - expected) / step)
    assert steps.max() <= 1 and np.allclose(np.abs(got - expected), steps * step, atol=1e-6)
    # How many depends on the trained model's near-boundary values: 0.4% to 2.1% seen.
    assert np.mean(steps > 0) < 0.05, f"{int(steps.sum())} of {steps.size} outputs are one step off"
    # The same predicted class for every sample, unless a one-step difference breaks a near-tie.
    top2 = np.sort(expected, axis=1)[:, -2:]
    near_tie = top2[:, 1] - top2[:, 0] <= step * 1.5
    flipped = got.argmax(1) != expected.argmax(1)
    assert not np.any(flipped & ~near_tie), np.flatnonzero(flipped & ~near_tie)
    print(f"tflite-runtime vs LiteRT: {flipped.sum()} of {len(x)} classes differ, "
          f"{int(steps.sum())} of {steps.size} outputs one step off")

    info = inspect_artifact(int8_model)
    assert (there["params"], there["ops"], there["est"]) == (info.params, info.ops, info.est_peak_memory_bytes)
    assert there["weight_dtypes"] == info.weight_dtypes and there["sparsity"] == pytest.approx(info.sparsity)

"""The memory estimate agrees with what the runtimes really use, on a net of ~17 MB.

One float32 MLP (1024 -> 2048 -> 1024 -> 10, 4.2 M parameters) as .tflite (tf_keras +
TFLiteConverter, in a subprocess) and as .onnx (the same weights, built with onnx.helper).
Each artifact is loaded and run on one sample in a fresh process, and the peak RSS growth
over the process with the runtime already imported is compared with `est_peak_memory_bytes`.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from support import helpers
import numpy as np
import pytest

from compressor.runtimes import inspect_artifact

pytestmark = pytest.mark.slow
onnx = pytest.importorskip("onnx")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BUILD_TFLITE = textwrap.dedent("""
    import numpy as np, tensorflow as tf, tf_keras as keras
    tf.random.set_seed(0)
    model = keras.Sequential([keras.layers.Input((1024,)), keras.layers.Dense(2048, activation="relu"),
                              keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10)])
    open("mlp.tflite", "wb").write(tf.lite.TFLiteConverter.from_keras_model(model).convert())
    x = np.random.default_rng(0).random((1, 1024), dtype=np.float32)
    weights = {f"{kind}{i}": w for i, layer in enumerate(model.layers)
               for kind, w in zip("wb", layer.get_weights())}
    np.savez("mlp.npz", x=x, y=model.predict(x, verbose=0), **weights)
""")

# Runs in a fresh process: import the runtime, then measure how far loading + one run raises RSS.
MEASURE = textwrap.dedent("""
    import gc, json, sys
    import numpy as np
    from compressor.runtimes import open_runtime

    def status(key):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))

    path, x = sys.argv[1], np.load(sys.argv[2])["x"]
    if path.endswith(".tflite"):
        from compressor.runtimes.tflite import _litert
        _litert()
    else:
        from compressor.runtimes.onnx import _ort
        _ort()
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:   # "5": reset the peak (VmHWM) to the current RSS
        f.write("5")
    base, base_peak = status("VmRSS"), status("VmHWM")
    y = open_runtime(path, threads=1).predict(x)
    print(json.dumps({"growth": status("VmHWM") - base, "reset_ok": base_peak - base < 2**20,
                      "y": y.tolist()}))
""")


def mlp_onnx(weights: dict, path) -> None:
    """The Keras MLP as MatMul + Add (+ Relu) nodes over the same float32 weights."""
    from onnx import TensorProto, helper, numpy_helper

    inits, nodes, prev = [], [], "x"
    for i in range(3):
        inits += [numpy_helper.from_array(weights[f"w{i}"], f"w{i}"),
                  numpy_helper.from_array(weights[f"b{i}"], f"b{i}")]
        nodes += [helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"])]
        prev = f"a{i}"
        if i < 2:
            nodes.append(helper.make_node("Relu", [prev], [f"r{i}"]))
            prev = f"r{i}"
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1024])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["N", 10])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


@pytest.fixture(scope="module")
def mlp_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mlp")
    helpers.run_keras_script(BUILD_TFLITE, folder, timeout=300)
    mlp_onnx(dict(np.load(folder / "mlp.npz")), folder / "mlp.onnx")
    return folder


def measure(path, npz) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", MEASURE, str(path), str(npz)], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("fmt", ["tflite", "onnx"])
def test_estimate_within_30_percent_of_measured_peak_rss(mlp_dir, fmt):
    pytest.importorskip("ai_edge_litert" if fmt == "tflite" else "onnxruntime")
    path = mlp_dir / f"mlp.{fmt}"
    assert path.stat().st_size > 16 * 10**6                      # 4.2 M float32 weights
    info = inspect_artifact(path)
    result = measure(path, mlp_dir / "mlp.npz")
    assert result["reset_ok"], "could not reset VmHWM through /proc/self/clear_refs"
    ref = np.load(mlp_dir / "mlp.npz")["y"]
    np.testing.assert_allclose(np.array(result["y"]), ref, rtol=1e-4, atol=1e-4 * np.ptp(ref))
    estimate, measured = info.est_peak_memory_bytes, result["growth"]
    print(f"{fmt}: estimate {estimate / 2**20:.1f} MiB, measured {measured / 2**20:.1f} MiB")
    assert abs(estimate - measured) <= 0.30 * measured, (estimate, measured)

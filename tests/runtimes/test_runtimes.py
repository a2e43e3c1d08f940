"""Artifacts run in their real runtimes and inspected from the file, with hand-checked numbers.

ONNX models are built with onnx.helper (fast); TFLite files come from a tiny tf_keras model
converted in a subprocess (slow: TensorFlow import + three conversions).
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

from support import helpers
import numpy as np
import pytest

from compressor.errors import ModelLoadError
from compressor.runtimes import inspect_artifact, open_runtime
from compressor.runtimes.common import (
    RUNTIME_OVERHEAD_BYTES,
    default_threads,
    peak_live_bytes,
)

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper

RNG = np.random.default_rng(0)
W1 = RNG.normal(size=(2, 1, 3, 3)).astype(np.float32)      # Conv kernel, 5 planted zeros
W1.flat[[0, 4, 9, 10, 17]] = 0
B1 = RNG.normal(size=2).astype(np.float32)
W2 = RNG.normal(size=(8, 3)).astype(np.float32)            # Gemm kernel, 3 planted zeros
W2.flat[[1, 7, 20]] = 0
B2 = RNG.normal(size=3).astype(np.float32)
# QDQ variant: per-channel symmetric int8 conv kernel, per-tensor gemm kernel with zero point 3
Q1 = RNG.choice(np.r_[-127:0, 1:128], size=W1.shape).astype(np.int8)
Q1.flat[[0, 4, 9, 10, 17]] = 0
S1 = np.array([0.01, 0.02], np.float32)
Q2 = RNG.choice(np.r_[-127:3, 4:128], size=W2.shape).astype(np.int8)
Q2.flat[[2, 5, 11, 23]] = 3                                  # 4 elements at the zero point ...
Q2.flat[[0, 6]] = 0                                          # ... and 2 zeros that are not "zero"
S2, ZP2 = np.float32(0.03), np.int8(3)


def reference(x, w1, w2):
    windows = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))  # N,1,2,2,3,3
    conv = np.einsum("nihwkl,oikl->nohw", windows, w1) + B1[None, :, None, None]
    return np.maximum(conv, 0).reshape(len(x), -1) @ w2 + B2


def build_onnx(path, qdq=False, batch="N"):
    t = helper.make_tensor
    inits = [t("B1", TensorProto.FLOAT, [2], B1)]
    nodes = [helper.make_node("Constant", [], ["B2"], value=t("b2", TensorProto.FLOAT, [3], B2))]
    if qdq:
        inits += [t("Q1", TensorProto.INT8, Q1.shape, Q1.tobytes(), raw=True),
                  t("S1", TensorProto.FLOAT, [2], S1), t("Z1", TensorProto.INT8, [2], [0, 0]),
                  t("Q2", TensorProto.INT8, Q2.shape, Q2.tobytes(), raw=True),
                  t("S2", TensorProto.FLOAT, [], [S2]), t("Z2", TensorProto.INT8, [], [int(ZP2)])]
        nodes += [helper.make_node("DequantizeLinear", ["Q1", "S1", "Z1"], ["W1"], axis=0),
                  helper.make_node("DequantizeLinear", ["Q2", "S2", "Z2"], ["W2"])]
    else:
        inits += [t("W1", TensorProto.FLOAT, W1.shape, W1), t("W2", TensorProto.FLOAT, W2.shape, W2)]
    nodes += [helper.make_node("Conv", ["x", "W1", "B1"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
              helper.make_node("Flatten", ["r"], ["f"]), helper.make_node("Gemm", ["f", "W2", "B2"], ["y"])]
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 1, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.fixture
def x():
    return np.random.default_rng(1).normal(size=(7, 1, 4, 4)).astype(np.float32)


def test_onnx_predict_matches_numpy(tmp_path, x):
    runtime = open_runtime(build_onnx(tmp_path / "m.onnx"), threads=1)
    assert runtime.threads == 1 and runtime.name.startswith("onnxruntime ")
    out = runtime.predict(x, batch_size=3)               # 3 + 3 + 1: a partial last batch
    assert out.dtype == np.float32 and out.shape == (7, 3)
    np.testing.assert_allclose(out, reference(x, W1, W2), rtol=1e-5, atol=1e-5)


def test_onnx_fixed_batch_model_is_padded(tmp_path, x):
    out = open_runtime(build_onnx(tmp_path / "m.onnx", batch=2)).predict(x[:5])
    np.testing.assert_allclose(out, reference(x[:5], W1, W2), rtol=1e-5, atol=1e-5)


def test_onnx_qdq_predict_uses_dequantized_weights(tmp_path, x):
    w1 = Q1.astype(np.float32) * S1[:, None, None, None]
    w2 = (Q2.astype(np.float32) - ZP2) * S2
    out, expected = open_runtime(build_onnx(tmp_path / "q.onnx", qdq=True)).predict(x), reference(x, w1, w2)
    # onnxruntime fuses DQ(int8 weight) -> Gemm into MatMulNBits, which computes with int8
    # activations (session.qdq_matmulnbits_accuracy_level 4): ~1% off an exact float matmul.
    assert np.abs(out - expected).max() <= 0.02 * np.ptp(expected)


def test_inspect_onnx_reads_weights_zeros_and_memory(tmp_path):
    info = inspect_artifact(build_onnx(tmp_path / "m.onnx"))
    weights = {w.name: w for w in info.weights}
    assert set(weights) == {"W1", "B1", "W2", "B2"}                 # B2 comes from a Constant node
    assert {n for n, w in weights.items() if w.is_kernel} == {"W1", "W2"}
    assert (weights["W1"].zeros, weights["W2"].zeros) == (5, 3)
    assert weights["W1"].shape == (2, 1, 3, 3) and weights["W1"].dtype == "float32"
    assert info.params == 18 + 2 + 24 + 3 and info.weight_dtypes == {"float32": 1.0}
    assert info.sparsity == pytest.approx(8 / 42)
    assert info.ops == {"Constant": 1, "Conv": 1, "Relu": 1, "Flatten": 1, "Gemm": 1}
    assert info.inputs == [{"name": "x", "shape": [-1, 1, 4, 4], "dtype": "float32"}]
    assert info.outputs == [{"name": "y", "shape": [-1, 3], "dtype": "float32"}]
    raw = (tmp_path / "m.onnx").read_bytes()
    assert info.size_bytes == len(raw) and 0 < info.gzip_bytes < info.size_bytes and len(info.sha256) == 64
    # batch 1, float32: x 64 B, conv 32, relu 32, flatten 32, gemm 12. Conv step: x + c = 96 is the
    # activation peak; loading holds a second copy of the largest initializer, W2 (24 * 4 = 96 B),
    # before the activations exist: weights + max(96, 96).
    assert info.est_peak_memory_bytes == 47 * 4 + 96 + RUNTIME_OVERHEAD_BYTES["onnx"]


def test_inspect_onnx_qdq_int8_kernels_and_zero_points(tmp_path):
    info = inspect_artifact(build_onnx(tmp_path / "q.onnx", qdq=True))
    weights = {w.name: w for w in info.weights}
    assert {n for n, w in weights.items() if w.is_kernel} == {"Q1", "Q2"}
    assert weights["Q1"].dtype == weights["Q2"].dtype == "int8"
    assert weights["Q1"].zeros == 5 and weights["Q2"].zeros == 4    # counted at the zero point 3
    assert info.sparsity == pytest.approx(9 / 42)
    assert info.weight_dtypes == pytest.approx({"int8": 45 / 53, "float32": 8 / 53}, abs=1e-6)
    assert info.ops["DequantizeLinear"] == 2


def test_liveness_on_a_skip_connection():
    # x -A-> a -B-> b, then C(x, b) -> y: x stays live across A and B for the skip.
    ops = [("A", ["x"], ["a"]), ("B", ["a"], ["b"]), ("C", ["x", "b"], ["y"])]
    sizes = {"x": 100, "a": 200, "b": 50, "y": 10}
    # step A: x + a = 300; step B: x + a + b = 350; step C: x + b + y = 160
    assert peak_live_bytes(ops, sizes, ["x"], ["y"]) == 350
    assert peak_live_bytes(ops, {**sizes, "w": 40}, ["x"], ["y"], persistent=["w"]) == 390
    assert peak_live_bytes([], {"x": 8}, ["x"], ["x"]) == 8


def test_latency_keys_and_threads(tmp_path, x):
    runtime = open_runtime(build_onnx(tmp_path / "m.onnx"))
    assert runtime.threads == default_threads(None) >= 1
    latency = runtime.latency_ms(x[:1], warmup=2, runs=10)
    assert set(latency) == {"p50", "p90"} and 0 < latency["p50"] <= latency["p90"]


@pytest.mark.parametrize("suffix", [".onnx", ".tflite"])
def test_corrupt_or_missing_file_raises_model_load_error(tmp_path, suffix):
    bad = tmp_path / f"bad{suffix}"
    bad.write_bytes(b"\x08\x07not a model at all" * 20)
    for call in (open_runtime, inspect_artifact):
        with pytest.raises(ModelLoadError, match="bad"):
            call(bad)
        with pytest.raises(ModelLoadError, match="no such file"):
            call(tmp_path / f"missing{suffix}")


def test_runtime_modules_import_no_framework():
    probe = ("import sys, compressor.runtimes, compressor.runtimes.tflite, compressor.runtimes.onnx, "
             "compressor.devices\nprint([m for m in ('onnx', 'onnxruntime', 'ai_edge_litert', "
             "'tflite_runtime', 'tensorflow') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


KERAS_SCRIPT = textwrap.dedent("""
    import numpy as np, tensorflow as tf, tf_keras as keras
    tf.random.set_seed(0)
    rng = np.random.default_rng(0)
    model = keras.Sequential([keras.layers.Input((8, 8, 1)), keras.layers.Conv2D(4, 3, activation="relu"),
                              keras.layers.Flatten(), keras.layers.Dense(10)])
    conv, dense = model.layers[0], model.layers[2]
    k, b = conv.get_weights(); k[..., 0] = 0; conv.set_weights([k, rng.normal(size=4) * 0.1])   # 9 zeros
    k, b = dense.get_weights(); k[:20, 0] = 0; dense.set_weights([k, rng.normal(size=10) * 0.1])  # 20 zeros
    x = rng.random((32, 8, 8, 1), dtype=np.float32)
    def convert(kind):
        c = tf.lite.TFLiteConverter.from_keras_model(model)
        if kind != "fp32":
            c.optimizations = [tf.lite.Optimize.DEFAULT]
        if kind == "fp16":
            c.target_spec.supported_types = [tf.float16]
        if kind == "int8":
            c.representative_dataset = lambda: ([x[i:i + 1]] for i in range(len(x)))
            c.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
            c.inference_input_type = c.inference_output_type = tf.int8
        open(kind + ".tflite", "wb").write(c.convert())
    for kind in ("fp32", "fp16", "int8"):
        convert(kind)
    np.savez("ref.npz", x=x, y=model.predict(x, verbose=0))
""")
PLANTED = 9 + 20
KERNEL_ELEMS = 36 + 144 * 10


@pytest.fixture(scope="module")
def tflite_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tflite")
    helpers.run_keras_script(KERAS_SCRIPT, folder, timeout=600)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("kind, rtol", [("fp32", 1e-5), ("fp16", 1e-3), ("int8", 0.02)])
def test_tflite_predict_matches_keras(tflite_dir, kind, rtol):
    ref = np.load(tflite_dir / "ref.npz")
    runtime = open_runtime(tflite_dir / f"{kind}.tflite", threads=1)
    out = runtime.predict(ref["x"], batch_size=5)       # resizes the input; partial last batch
    assert out.dtype == np.float32 and out.shape == ref["y"].shape
    span = np.ptp(ref["y"])
    assert np.abs(out - ref["y"]).max() <= rtol * span + 1e-6, np.abs(out - ref["y"]).max() / span
    latency = runtime.latency_ms(ref["x"][:1], warmup=2, runs=10)
    assert runtime.threads == 1 and 0 < latency["p50"] <= latency["p90"]


@pytest.mark.slow
@pytest.mark.parametrize("kind, dtype", [("fp32", "float32"), ("fp16", "float16"), ("int8", "int8")])
def test_inspect_tflite_reads_stored_dtypes_and_zeros(tflite_dir, kind, dtype):
    info = inspect_artifact(tflite_dir / f"{kind}.tflite")
    kernels = [w for w in info.weights if w.is_kernel]
    assert sorted(w.shape for w in kernels) == [(4, 3, 3, 1), (10, 144)]
    assert {w.dtype for w in kernels} == {dtype}
    assert info.weight_dtypes[dtype] > 0.95 and sum(info.weight_dtypes.values()) == pytest.approx(1)
    zeros = sum(w.zeros for w in kernels)
    # int8 rounding may zero a few more small weights; float formats keep exactly the planted ones
    assert zeros == PLANTED if kind != "int8" else PLANTED <= zeros < PLANTED + 30
    assert info.sparsity == pytest.approx(zeros / KERNEL_ELEMS)
    assert info.params >= 36 + 4 + 1440 + 10 and 0 < info.gzip_bytes < info.size_bytes
    assert info.ops["CONV_2D"] == info.ops["FULLY_CONNECTED"] == 1
    assert ("DEQUANTIZE" in info.ops) == (kind == "fp16")        # fp16 weights are dequantized at load
    assert info.inputs[0]["shape"] == [-1, 8, 8, 1]
    assert info.inputs[0]["dtype"] == ("int8" if kind == "int8" else "float32")


@pytest.mark.slow
def test_tflite_memory_estimate_by_hand(tflite_dir):
    info = inspect_artifact(tflite_dir / "fp32.tflite")
    # the mmapped file, plus XNNPACK's packed copy of the conv and dense weights and biases
    # (36 + 4 + 1440 + 10 float32), plus batch-1 activations: input 256 B, conv 576, reshape 576,
    # dense 40; the RESHAPE step's 576 + 576 = 1152 is the peak
    packed = (36 + 4 + 1440 + 10) * 4
    assert info.est_peak_memory_bytes - info.size_bytes - RUNTIME_OVERHEAD_BYTES["tflite"] == packed + 1152
    fp16 = inspect_artifact(tflite_dir / "fp16.tflite")
    # fp16 weights reach the ops through DEQUANTIZE: their float32 copies (the same 1490 values)
    # live for the whole run, plus one temporary float32 buffer as large as the dense kernel
    assert fp16.est_peak_memory_bytes - fp16.size_bytes - RUNTIME_OVERHEAD_BYTES["tflite"] == \
        packed + 1152 + 1440 * 4


def test_tflite_runtime_fallback_and_missing_runtime(monkeypatch):
    import types

    from compressor.errors import BackendUnavailableError
    from compressor.runtimes import tflite

    monkeypatch.setitem(sys.modules, "ai_edge_litert.interpreter", None)   # import of it now fails
    fake = types.ModuleType("tflite_runtime.interpreter")
    fake.Interpreter, fake.OpResolverType = object, object
    monkeypatch.setitem(sys.modules, "tflite_runtime", types.ModuleType("tflite_runtime"))
    monkeypatch.setitem(sys.modules, "tflite_runtime.interpreter", fake)
    assert tflite._litert()[0] is object and tflite._litert()[2].startswith("tflite-runtime")
    monkeypatch.setitem(sys.modules, "tflite_runtime.interpreter", None)
    with pytest.raises(BackendUnavailableError, match="pip install ai-edge-litert"):
        tflite._litert()

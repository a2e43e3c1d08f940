"""compressor.export.onnx_quant on small ONNX graphs built here: static QDQ (a BatchNorm +
skip conv net, token-id input), dynamic and weight-only (embedding + attention-like MatMuls
behind a Transpose, Gemm, LSTM). Every number is read back from the written file or from
onnxruntime running it."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from support.artifact_checks import onnxruntime_graph
import pytest

from compressor.export.onnx_quant import (calibration_batches, quantize_onnx_dynamic,
                                          quantize_onnx_static, quantize_onnx_weight_only)
from compressor.runtimes import inspect_artifact

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

RNG = np.random.default_rng(0)
FLOAT_KERNELS = ("Conv", "MatMul", "Gemm", "FusedConv", "FusedGemm", "FusedMatMul")
INT8_KERNELS = ("QLinearConv", "QLinearMatMul", "QGemm", "ConvInteger", "MatMulInteger",
                "DynamicQuantizeMatMul")


def _weight(name: str, *shape: int, zeros: float = 0.0) -> onnx.TensorProto:
    values = RNG.normal(0, 0.3, shape).astype(np.float32)
    values[RNG.random(shape) < zeros] = 0.0
    return numpy_helper.from_array(values, name)


def _save(nodes, inputs, outputs, initializers, path: Path) -> Path:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def conv_net(path: Path) -> Path:
    """Conv -> BatchNorm -> Relu -> Conv -> Add(skip) -> Relu -> ReduceMean over H, W (how
    PyTorch exports global pooling) -> Gemm, conv weights 30% zeros (pruned)."""
    c = 16
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "g", "b", "m", "v"], ["n1"], name="bn1"),
        helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "r1"], ["s"], name="skip"),
        helper.make_node("Relu", ["s"], ["r2"], name="relu2"),
        helper.make_node("ReduceMean", ["r2"], ["p"], name="pool", axes=[2, 3], keepdims=1),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wd", "bd"], ["y"], name="head", transB=1),
    ]
    inits = [_weight("w1", c, 3, 3, 3, zeros=0.3), _weight("w2", c, c, 3, 3, zeros=0.3),
             _weight("b2", c), _weight("wd", 10, c), _weight("bd", 10),
             numpy_helper.from_array(RNG.uniform(0.5, 1.5, c).astype(np.float32), "g"),
             _weight("b", c), _weight("m", c),
             numpy_helper.from_array(RNG.uniform(0.5, 1.5, c).astype(np.float32), "v")]
    return _save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 12, 12])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 10])], inits, path)


def token_net(path: Path) -> Path:
    """int64 token ids -> embedding Gather -> MatMul (weight stored transposed, behind a
    Transpose) -> Relu -> Gemm head on the first token; and an LSTM over the embeddings."""
    vocab, d, hidden = 50, 32, 8
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
        helper.make_node("Transpose", ["wq_t"], ["wq"], name="wq_transpose", perm=[1, 0]),
        helper.make_node("MatMul", ["e", "wq"], ["q"], name="query"),
        helper.make_node("Relu", ["q"], ["r"], name="relu"),
        helper.make_node("Gather", ["r", "zero"], ["first"], name="first_token", axis=1),
        helper.make_node("Gemm", ["first", "wd", "bd"], ["y"], name="head"),
        helper.make_node("Transpose", ["e"], ["e_seq"], name="seq_major", perm=[1, 0, 2]),
        helper.make_node("LSTM", ["e_seq", "lw", "lr"], ["", "h"], name="lstm",
                         hidden_size=hidden),
    ]
    inits = [_weight("table", vocab, d), _weight("wq_t", d, d), _weight("wd", d, 4),
             _weight("bd", 4), _weight("lw", 1, 4 * hidden, d), _weight("lr", 1, 4 * hidden, hidden),
             numpy_helper.from_array(np.array(0, dtype=np.int64), "zero")]
    return _save(nodes, [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n", 6])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4]),
                  helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, "n", hidden])],
                 inits, path)


def run(path: Path, feed: dict) -> list[np.ndarray]:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)


def int8_byte_fraction(path: Path) -> float:
    """int8 share of the bytes of weight matrices (scales, zero points, biases left out)."""
    weights = [w for w in inspect_artifact(path).weights if len(w.shape) >= 2 and min(w.shape) > 1]
    nbytes = {w.name: w.size * np.dtype(w.dtype).itemsize for w in weights}
    return sum(n for w in weights for n in [nbytes[w.name]] if w.dtype == "int8") / \
        sum(nbytes.values())


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("onnx_quant")
    conv_net(folder / "conv.onnx")
    token_net(folder / "tokens.onnx")
    return folder


def test_static_runs_every_kernel_in_int8_and_keeps_zeros(built, tmp_path):
    x = RNG.random((64, 3, 12, 12), dtype=np.float32)
    out = tmp_path / "conv_int8.onnx"
    quantize_onnx_static(built / "conv.onnx", out, calibration_batches({"x": x}, 16))
    counts, requantized = onnxruntime_graph(out, tmp_path)
    ops = Counter(counts)
    assert not any(ops[op] for op in FLOAT_KERNELS), ops
    assert ops["QLinearConv"] == 2 and ops["QLinearAdd"] == 1, ops
    assert ops["QLinearGlobalAveragePool"] == 1 and not ops["ReduceMean"], ops
    assert requantized == 0
    assert "BatchNormalization" not in inspect_artifact(out).ops       # folded into conv1
    kernels = [w for w in inspect_artifact(out).weights if w.is_kernel]
    assert {w.dtype for w in kernels} == {"int8"}
    int8_weights = [numpy_helper.to_array(init) for init in onnx.load(str(out)).graph.initializer
                    if init.data_type == TensorProto.INT8 and len(init.dims) > 1]
    assert max(int(np.abs(w).max()) for w in int8_weights) <= 64   # 7-bit (reduce_range)
    conv_zeros = sum(w.zeros for w in kernels if len(w.shape) == 4) / \
        sum(w.size for w in kernels if len(w.shape) == 4)
    assert conv_zeros >= 0.29                 # pruned zeros stay exact zeros in int8
    assert cosine(run(out, {"x": x[:16]})[0], run(built / "conv.onnx", {"x": x[:16]})[0]) > 0.99
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("onnx-quant-")] == []


def test_static_excluded_node_stays_float(built, tmp_path):
    x = RNG.random((32, 3, 12, 12), dtype=np.float32)
    out = tmp_path / "conv_mixed.onnx"
    quantize_onnx_static(built / "conv.onnx", out, calibration_batches({"x": x}), ["conv2"])
    dtypes = {w.name: w.dtype for w in inspect_artifact(out).weights if w.is_kernel}
    assert dtypes["w2"] == "float32" and list(dtypes.values()).count("int8") == 2, dtypes


def test_static_feeds_token_ids_as_integers(built, tmp_path):
    ids = RNG.integers(0, 50, (48, 6), dtype=np.int64)
    out = tmp_path / "tokens_static.onnx"
    quantize_onnx_static(built / "tokens.onnx", out, calibration_batches({"ids": ids}))
    assert inspect_artifact(out).inputs[0]["dtype"] == "int64"
    assert cosine(run(out, {"ids": ids})[0], run(built / "tokens.onnx", {"ids": ids})[0]) > 0.98


def test_dynamic_quantizes_weights_behind_transposes_and_embeddings(built, tmp_path):
    ids = RNG.integers(0, 50, (16, 6), dtype=np.int64)
    out = tmp_path / "tokens_dynamic.onnx"
    quantize_onnx_dynamic(built / "tokens.onnx", out)
    assert int8_byte_fraction(out) >= 0.95
    ops = inspect_artifact(out).ops
    assert ops.get("MatMulInteger", 0) + ops.get("DynamicQuantizeMatMul", 0) >= 2, ops
    assert ops.get("DynamicQuantizeLSTM") == 1, ops
    reference, quantized = run(built / "tokens.onnx", {"ids": ids}), run(out, {"ids": ids})
    assert all(cosine(a, b) > 0.98 for a, b in zip(reference, quantized))
    # the embedding gathers int8 rows, then scales them: the table is never dequantized whole
    graph = onnx.load(str(out)).graph
    int8_tables = {i.name for i in graph.initializer if i.data_type == TensorProto.INT8
                   and tuple(i.dims) == (50, 32)}
    assert [n.op_type for n in graph.node if set(n.input) & int8_tables] == ["Gather"]


def test_weight_only_stores_int8_and_computes_float(built, tmp_path):
    ids = RNG.integers(0, 50, (16, 6), dtype=np.int64)
    out = tmp_path / "tokens_weight_only.onnx"
    quantize_onnx_weight_only(built / "tokens.onnx", out, exclude_nodes=["head"])
    info = inspect_artifact(out)
    dtypes = {w.name: w.dtype for w in info.weights if w.size > 4}
    assert dtypes["wd"] == "float32"                             # excluded
    assert [d for name, d in dtypes.items() if name != "wd" and not name.endswith("_scale")
            ] == ["int8"] * 4                                     # table, query, LSTM W and R
    assert not any(op in info.ops for op in INT8_KERNELS)
    reference, quantized = run(built / "tokens.onnx", {"ids": ids}), run(out, {"ids": ids})
    assert all(cosine(a, b) > 0.999 for a, b in zip(reference, quantized))

"""What an ONNX file holds beside the model (compressor/export/onnx_compact.py): every saved
graph drops value_info and long internal names, a quantized one stores its side parameters as
float16 and no all-zero weight zero points; the outputs stay what they were."""
from __future__ import annotations

import numpy as np
import pytest

from compressor.export.onnx_compact import (compact, drop_zero_weight_zero_points,
                                            float16_side_params)

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

K, N = 32, 24


def _graph():
    """x -> MatMul(w) -> Add(bias) -> Mul(tiny) -> Relu -> y, converter-style long names,
    value_info and an opset import nothing uses."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.1, (K, N)).astype(np.float32),
                                     "encoder.layer.0.attention.self.query.weight"),
             numpy_helper.from_array(rng.normal(0, 0.1, N).astype(np.float32),
                                     "encoder.layer.0.attention.self.query.bias"),
             numpy_helper.from_array(np.full(N, 1e-7, np.float32), "tiny_scale")]
    nodes = [helper.make_node("MatMul", ["x", inits[0].name], ["node_MatMul_74_output_0"],
                              name="node_MatMul_74"),
             helper.make_node("Add", ["node_MatMul_74_output_0", inits[1].name],
                              ["node_Add_75_output_0"], name="node_Add_75"),
             helper.make_node("Mul", ["node_Add_75_output_0", "tiny_scale"], ["scaled"],
                              name="node_Mul_76"),
             helper.make_node("Relu", ["scaled"], ["y"], name="node_Relu_77")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", N])], inits,
        value_info=[helper.make_tensor_value_info(n.output[0], TensorProto.FLOAT, ["n", N])
                    for n in nodes[:-1]])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


def _run(model, x):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_compact_keeps_what_is_computed_and_drops_the_rest():
    model, x = _graph(), np.random.default_rng(1).normal(size=(4, K)).astype(np.float32)
    before, expected = model.ByteSize(), _run(model, x)
    compact(model)
    onnx.checker.check_model(model)
    np.testing.assert_array_equal(_run(model, x), expected)
    graph = model.graph
    assert [v.name for v in graph.input] == ["x"] and [v.name for v in graph.output] == ["y"]
    assert not graph.value_info
    assert max(len(name) for node in graph.node for name in [*node.input, *node.output]
               if name not in ("x", "y")) <= 2
    # only the node reading a weight keeps its name (inspection names the weight by it)
    assert [node.name for node in graph.node] == ["node_MatMul_74", "", "", ""]
    assert [o.domain for o in model.opset_import] == [""]
    assert model.ByteSize() < before - 300, (model.ByteSize(), before)


def test_side_params_are_float16_where_it_holds_them():
    model, x = _graph(), np.random.default_rng(1).normal(size=(4, K)).astype(np.float32)
    expected = _run(model, x)
    assert float16_side_params(model) == 1   # the bias; the weight is MatMul's, 1e-7 subnormal
    onnx.checker.check_model(model)
    types = {init.name: init.data_type for init in model.graph.initializer}
    assert types == {"encoder.layer.0.attention.self.query.weight": TensorProto.FLOAT,
                     "encoder.layer.0.attention.self.query.bias_f16": TensorProto.FLOAT16,
                     "tiny_scale": TensorProto.FLOAT}
    np.testing.assert_allclose(_run(model, x), expected, rtol=1e-3, atol=1e-10)


def test_all_zero_weight_zero_points_go():
    rng = np.random.default_rng(0)
    weights = rng.integers(-127, 128, (K, N)).astype(np.int8)
    inits = [numpy_helper.from_array(weights, "w"),
             numpy_helper.from_array(np.zeros(N, np.int8), "w_zero"),
             numpy_helper.from_array(np.array([3] * N, np.int8), "w_zero_3")]
    nodes = [helper.make_node("MatMulInteger", ["a", "w", "a_zero", "w_zero"], ["p"]),
             helper.make_node("MatMulInteger", ["a", "w", "a_zero", "w_zero_3"], ["q"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("a", TensorProto.UINT8, [2, K]),
                     helper.make_tensor_value_info("a_zero", TensorProto.UINT8, [])],
        [helper.make_tensor_value_info(name, TensorProto.INT32, [2, N]) for name in "pq"], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feed = {"a": rng.integers(0, 256, (2, K)).astype(np.uint8), "a_zero": np.array(128, np.uint8)}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feed)
    assert drop_zero_weight_zero_points(model) == 1
    assert [len(node.input) for node in model.graph.node] == [3, 4]
    assert sorted(init.name for init in model.graph.initializer) == ["w", "w_zero_3"]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for got, want in zip(session.run(None, feed), expected):
        np.testing.assert_array_equal(got, want)

"""Constant tables in int8 ONNX files (issue 27, item 5): the position-embedding slice the
torch exporter folds out of its Gather (a [1, T, D] float32 constant added to the token
embeddings) was left float by every int8 route. `store_int8_tables` stores it int8 per row
behind DequantizeLinear; masks, 1-D tensors and small constants stay float."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from compressor.export.onnx_quant import quantize_onnx_dynamic
from compressor.export.onnx_weight_only import store_int8_tables
from compressor.runtimes import inspect_artifact

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

RNG = np.random.default_rng(0)
T, D = 32, 32


def _embedding_model() -> onnx.ModelProto:
    """ids -> Gather(token table) + position table -> + mask -> + a 1-D offset -> MatMul."""
    constants = {
        "tokens": RNG.normal(0, 0.3, (20, D)), "positions": RNG.normal(0, 0.1, (1, T, D)),
        "mask": np.where(RNG.random((1, T, D)) < 0.5, 0.0, -1e9),   # a sentinel, not a table
        "offset": RNG.normal(0, 0.1, (T * 64,)),   # a bias ([1, C] once folded): stays float
        "kernel": RNG.normal(0, 0.3, (D, 64))}
    initializers = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in constants.items()]
    nodes = [helper.make_node("Gather", ["tokens", "ids"], ["embedded"], name="embed"),
             helper.make_node("Add", ["embedded", "positions"], ["placed"], name="add_positions"),
             helper.make_node("Add", ["placed", "mask"], ["masked"], name="add_mask"),
             helper.make_node("MatMul", ["placed", "kernel"], ["projected"], name="project"),
             helper.make_node("Reshape", ["projected", "flat_shape"], ["flat"], name="flatten"),
             helper.make_node("Unsqueeze", ["offset", "zero"], ["offset_2d"], name="unsqueeze"),
             helper.make_node("Add", ["flat", "offset_2d"], ["y"], name="add_offset")]
    initializers += [numpy_helper.from_array(np.array([-1, T * 64], np.int64), "flat_shape"),
                     numpy_helper.from_array(np.array([0], np.int64), "zero")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", T])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", T * 64]),
         helper.make_tensor_value_info("masked", TensorProto.FLOAT, ["N", T, D])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _run(model: onnx.ModelProto, ids: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"ids": ids})


def test_the_position_table_is_int8_per_row_and_the_mask_stays_float():
    model = _embedding_model()
    ids = RNG.integers(0, 20, (4, T)).astype(np.int64)
    before = _run(model, ids)
    assert store_int8_tables(model, exclude_nodes=()) == 1
    onnx.checker.check_model(model)
    initializers = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert "positions" not in initializers and initializers["positions_int8"].dtype == np.int8
    assert initializers["positions_int8_scale"].shape == (T,)   # one scale per position
    assert initializers["mask"].dtype == np.float32 and initializers["offset"].dtype == np.float32
    (dequantize,) = [n for n in model.graph.node if n.op_type == "DequantizeLinear"]
    assert list(dequantize.output) == ["positions"] and dequantize.attribute[0].i == 1
    after = _run(model, ids)
    # the table's int8 rounding: at most half a step of its largest row (0.1 x 4 sigma / 127)
    assert np.max(np.abs(after[0] - before[0])) < 0.05
    np.testing.assert_array_equal(after[1] < -1e8, before[1] < -1e8)


def test_excluded_readers_keep_their_table_float():
    model = _embedding_model()
    assert store_int8_tables(model, exclude_nodes={"add_positions"}) == 0


def test_dynamic_int8_reads_back_int8_with_the_folded_table(tmp_path: Path):
    """Read back from the written file: the position table is int8; what stays float of the
    gate's 1024+ element tensors is the mask (a sentinel, float32) and the bias (folded to
    [1, C]; float16, as the side parameters of a quantized file are: onnx_compact.py)."""
    source, target = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(_embedding_model(), str(source))
    quantize_onnx_dynamic(source, target)
    weights = inspect_artifact(target).weights
    assert any(w.dtype == "int8" and w.shape == (1, T, D) for w in weights)
    floats = {dtype: [w.size for w in weights if w.dtype == dtype and w.size >= 1024]
              for dtype in ("float32", "float16")}
    assert floats == {"float32": [T * D], "float16": [T * 64]}, \
        [(w.name, w.shape, w.dtype) for w in weights]


def test_a_token_type_table_stays_float(tmp_path: Path):
    """A 2-row table every token reads (a BERT's token types): its int8 rounding would be one
    error added to every token, for 768 bytes saved; it stays float32, the vocabulary int8."""
    initializers = [numpy_helper.from_array(RNG.normal(0, 0.3, shape).astype(np.float32), name)
                    for name, shape in (("tokens", (50, D)), ("types", (2, D)))]
    initializers.append(numpy_helper.from_array(np.array(0, np.int64), "zero"))
    nodes = [helper.make_node("Gather", ["tokens", "ids"], ["words"], name="embed"),
             helper.make_node("Mul", ["ids", "zero"], ["type_ids"], name="all_type_0"),
             helper.make_node("Gather", ["types", "type_ids"], ["kinds"], name="embed_types"),
             helper.make_node("Add", ["words", "kinds"], ["y"], name="add_types")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", T])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", T, D])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    source, target = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(model, str(source))
    quantize_onnx_dynamic(source, target)
    dtypes = {w.shape: w.dtype for w in inspect_artifact(target).weights if len(w.shape) == 2}
    assert dtypes[(2, D)] == "float32" and dtypes[(50, D)] == "int8", dtypes

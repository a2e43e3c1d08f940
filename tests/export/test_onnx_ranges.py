"""Learned (QAT) activation ranges carried into onnxruntime's static int8: matched to ONNX
tensors by value, not name; a ReLU whose learned range reaches below zero keeps its clamp; of
the learned-range file and the recalibrated one, the one closer to the float graph is kept."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from compressor.export import onnx_quant  # noqa: E402
from compressor.export.onnx_ranges import (LearnedRange, LearnedRanges,  # noqa: E402
                                           closest_to_float, range_overrides)


@pytest.fixture(scope="module")
def conv_relu_conv(tmp_path_factory):
    """x (N, 3, 8, 8) -> Conv -> Relu ("hidden") -> Conv -> y; the first conv's outputs are
    half negative, so a ReLU that lost its clamp shows."""
    rng = np.random.default_rng(0)
    first = numpy_helper.from_array(rng.normal(0, 0.5, (8, 3, 3, 3)).astype(np.float32), "w1")
    second = numpy_helper.from_array(rng.normal(0, 0.5, (4, 8, 1, 1)).astype(np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["pre"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["pre"], ["hidden"]),
             helper.make_node("Conv", ["hidden", "w2"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4, 8, 8])], [first, second])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path_factory.mktemp("ranges") / "float.onnx"
    onnx.save(onnx.shape_inference.infer_shapes(model), str(path))
    return path, rng.uniform(-1, 1, (64, 3, 8, 8)).astype(np.float32)


def _run(path, x, output="y"):
    model = onnx.load(str(path))
    if output not in [value.name for value in model.graph.output]:
        model.graph.output.append(helper.make_tensor_value_info(output, TensorProto.FLOAT, None))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run([output], {"x": x})[0]


def test_ranges_attach_to_the_tensor_with_the_same_values(conv_relu_conv):
    path, x = conv_relu_conv
    hidden = _run(path, x[:8], "hidden")
    channels_last = hidden.transpose(0, 2, 3, 1)        # as Keras holds it
    learned = LearnedRanges({"x": x[:8]}, (LearnedRange(channels_last, -6.0, 6.0),
                                          LearnedRange(x[:8], -1.0, 1.0)))
    overrides = range_overrides(path, learned)
    assert set(overrides) == {"hidden", "x"}
    assert (float(overrides["hidden"][0]["rmin"]), float(overrides["hidden"][0]["rmax"])) == (-6, 6)
    shifted = LearnedRanges({"x": x[:8]}, (LearnedRange(channels_last + 0.01, 0.0, 6.0),))
    assert range_overrides(path, shifted) == {}


def test_a_relu_keeps_its_clamp_under_a_range_below_zero(conv_relu_conv, tmp_path):
    """tfmot's ranges start at [-6, 6]: onnxruntime drops a ReLU before a QuantizeLinear and
    lets the clamp to the range do its work, which passes the negatives through with such a
    range (output error 0.98 of the float output's RMS); kept explicit, 0.020."""
    path, x = conv_relu_conv
    hidden = _run(path, x[:8], "hidden")
    learned = LearnedRanges({"x": x[:8]}, (LearnedRange(hidden, -6.0, 6.0),))
    out = tmp_path / "learned.onnx"
    onnx_quant.quantize_onnx_static(path, out, onnx_quant.calibration_batches({"x": x}),
                                    learned=learned)
    want, got = _run(path, x), _run(out, x)
    error = np.sqrt(np.mean((got - want) ** 2) / np.mean(want ** 2))
    assert error < 0.05, error
    ops = [node.op_type for node in onnx.load(str(out)).graph.node]
    assert "Relu" in ops


def test_the_file_closer_to_the_float_graph_is_kept(conv_relu_conv, tmp_path):
    path, x = conv_relu_conv
    batches = onnx_quant.calibration_batches({"x": x})
    calibrated, clipped = tmp_path / "calibrated.onnx", tmp_path / "clipped.onnx"
    onnx_quant.quantize_onnx_static(path, calibrated, batches)
    hidden = _run(path, x[:8], "hidden")
    onnx_quant.quantize_onnx_static(path, clipped, batches, learned=LearnedRanges(
        {"x": x[:8]}, (LearnedRange(hidden, 0.0, 0.05),)))     # clips nearly everything
    assert closest_to_float(path, [clipped, calibrated], batches) == calibrated
    assert closest_to_float(path, [calibrated, path], batches) == path

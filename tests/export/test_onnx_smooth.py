"""Dynamic int8 of a transformer block whose LayerNorm output carries two outlier channels (30x
the rest, with the small weight rows a trained model gives them, as pretrained BERTs do): the
toolkit's route (outliers smoothed into the weights, 7-bit weights) keeps the output above the
issue's 0.995 mean cosine; onnxruntime's quantize_dynamic alone falls below it on any CPU (the
outliers, not the AVX2 u8 x s8 saturation, cost it: its u8 x u8 form misses too)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from compressor.export.onnx_quant import quantize_onnx_dynamic

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

VOCAB, TOKENS, WIDTH, HIDDEN, OUTLIER = 64, 16, 32, 128, 30.0
BOUND = 0.995


def outlier_block(path: Path) -> Path:
    """ids -> embedding -> LayerNorm (channels 3 and 17 scaled 30x) -> MatMul + bias -> Relu ->
    MatMul: the feed-forward half of an encoder layer."""
    rng = np.random.default_rng(0)
    gamma = np.ones(WIDTH, np.float32)
    gamma[[3, 17]] = OUTLIER
    up = rng.normal(0, WIDTH ** -0.5, (WIDTH, HIDDEN)).astype(np.float32)
    up[[3, 17]] /= OUTLIER
    weights = {"table": rng.normal(0, 1, (VOCAB, WIDTH)), "gamma": gamma,
               "beta": rng.normal(0, 0.1, WIDTH), "up": up, "bias": rng.normal(0, 0.1, HIDDEN),
               "down": rng.normal(0, HIDDEN ** -0.5, (HIDDEN, WIDTH))}
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
             helper.make_node("LayerNormalization", ["e", "gamma", "beta"], ["h"], name="norm"),
             helper.make_node("MatMul", ["h", "up"], ["a"], name="up_proj"),
             helper.make_node("Add", ["a", "bias"], ["b"], name="up_bias"),
             helper.make_node("Relu", ["b"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "down"], ["y"], name="down_proj")]
    graph = helper.make_graph(
        nodes, "block", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n", TOKENS])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", TOKENS, WIDTH])],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def mean_cosine(path: Path, ids: np.ndarray, reference: np.ndarray) -> float:
    out = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"ids": ids})[0].reshape(len(ids), -1)
    want = reference.reshape(len(ids), -1)
    return float(np.mean(np.sum(out * want, 1) / np.linalg.norm(out, axis=1)
                         / np.linalg.norm(want, axis=1)))


@pytest.fixture(scope="module")
def block(tmp_path_factory):
    folder = tmp_path_factory.mktemp("smooth")
    rng = np.random.default_rng(1)
    ids = rng.integers(0, VOCAB, (64, TOKENS)).astype(np.int64)
    calibration = [{"ids": rng.integers(0, VOCAB, (32, TOKENS)).astype(np.int64)}]
    source = outlier_block(folder / "block.onnx")
    reference = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(
        None, {"ids": ids})[0]
    return folder, source, ids, calibration, reference


def test_smoothed_dynamic_int8_keeps_the_outlier_block_above_the_bound(block):
    folder, source, ids, calibration, reference = block
    out = folder / "smoothed.onnx"
    quantize_onnx_dynamic(source, out, calibration=calibration)
    assert mean_cosine(out, ids, reference) >= BOUND
    graph = onnx.load(str(out)).graph
    # one Mul: the LayerNorm output's; the Relu output has no outlier channel to smooth
    assert [n.output[0] for n in graph.node if n.name.endswith("_smoothed_mul")] == ["h_smoothed"]
    assert not any(i.data_type == TensorProto.FLOAT and len(i.dims) == 2 for i in graph.initializer)


@pytest.mark.parametrize("weight_type", ["QInt8", "QUInt8"])
def test_onnxruntime_quantize_dynamic_alone_misses_it(block, weight_type):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    folder, source, ids, _, reference = block
    out = folder / f"vendor_{weight_type}.onnx"
    quantize_dynamic(str(source), str(out), per_channel=True,
                     weight_type=getattr(QuantType, weight_type))
    assert mean_cosine(out, ids, reference) < BOUND


def test_without_training_samples_nothing_is_smoothed(block):
    """Dynamic int8 needs no data; without it the outliers stay, and so does the loss."""
    folder, source, ids, _, reference = block
    out = folder / "unsmoothed.onnx"
    quantize_onnx_dynamic(source, out)
    assert not any(n.name.endswith("_smoothed_mul") for n in onnx.load(str(out)).graph.node)
    assert mean_cosine(out, ids, reference) < BOUND


def test_smoothing_keeps_the_float_function_and_skips_excluded_nodes(block):
    from compressor.export.onnx_smooth import smoothed

    folder, source, ids, calibration, reference = block
    target = smoothed(source, calibration, {"down_proj"}, folder / "smoothed_fp32.onnx")
    assert mean_cosine(target, ids, reference) > 0.99999
    graph = onnx.load(str(target)).graph
    readers = {n.name: list(n.input) for n in graph.node}
    assert readers["up_proj"][0] == "h_smoothed" and readers["down_proj"] == ["r", "down"]

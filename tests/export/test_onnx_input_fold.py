"""In-model input preprocessing folded into the first conv before int8 (issue 27 item 6).

keras.applications' EfficientNetV2B0 / MobileNetV3Small fed images in [0, 1] (their Rescaling
expects [0, 255]) lost 85 pt in our int8 ONNX and 37-57 pt in TFLiteConverter's int8: the stem
conv's input is a narrow band far from zero, ~2 of 256 uint8 levels. On a net of that shape
(support/onnx_vision_nets.py) the numbers below are read from the int8 files in onnxruntime.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from support.layer_error import layer_errors
from support.onnx_vision_nets import mobilenet_like, quadrant_images

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from compressor.export import onnx_quant  # noqa: E402
from compressor.export.onnx_input_fold import fold_input_affine  # noqa: E402


def run(model, x: np.ndarray) -> np.ndarray:
    source = model.SerializeToString() if hasattr(model, "SerializeToString") else str(model)
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    return session.run(None, {"image": x})[0]


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    images, labels = quadrant_images(320)
    path = mobilenet_like(tmp_path_factory.mktemp("fold") / "net.onnx", images[:192], labels[:192])
    return path, images[:192], images[192:], labels[192:]


def test_the_fold_is_exact_and_the_stem_reads_the_raw_image(net):
    path, train, val, _ = net
    model = onnx.load(str(path))
    assert fold_input_affine(model, {"image": train[:8]}) == ["stem"]
    ops = [node.op_type for node in model.graph.node]
    assert ops[:3] == ["Transpose", "Conv", "Add"]            # the border map after the stem
    assert Counter(ops)["Div"] == 0 and Counter(ops)["Sub"] == 0
    stem = model.graph.node[1]
    assert stem.input[0] == model.graph.node[0].output[0]
    assert model.graph.node[0].input[0] == "image"
    want, got = run(path, val), run(model, val)
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()


def test_what_the_fold_leaves_alone(net):
    path, train, _, _ = net
    model = onnx.load(str(path))
    div = next(node for node in model.graph.node if node.op_type == "Div")
    div.input[0], div.input[1] = div.input[1], div.input[0]    # std / x is not affine
    assert fold_input_affine(model, {"image": train[:8]}) == []
    model = onnx.load(str(path))
    model.graph.output.append(onnx.helper.make_tensor_value_info(
        "normalized", onnx.TensorProto.FLOAT, None))              # read by more than the conv
    assert fold_input_affine(model, {"image": train[:8]}) == []
    model = onnx.load(str(path))
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "height"   # size unknown
    assert fold_input_affine(model, {"image": train[:8]}) == []
    # the int8 route folds only a narrow band: images in the [0, 255] the preprocessing expects
    # span 0.9+ of their range, the [0, 1] ones 0.008
    model = onnx.load(str(path))
    assert fold_input_affine(model, {"image": train[:32] * 255}, onnx_quant.NARROW_INPUT) == []
    assert fold_input_affine(model, {"image": train[:32]}, onnx_quant.NARROW_INPUT) == ["stem"]


def test_int8_of_images_the_preprocessing_does_not_expect(net, tmp_path, monkeypatch):
    """Before (no fold): agreement 0.28, max softmax diff 0.31, the stem conv's output off by
    0.125 of its std; after: 0.99, 0.12, 0.016."""
    path, train, val, labels = net
    reference = run(path, val)
    assert np.mean(reference.argmax(1) == labels) == 1.0
    batches = onnx_quant.calibration_batches({"image": train}, 32)
    scores, stem = {}, {}
    for route in ("unfolded", "folded"):
        if route == "unfolded":
            monkeypatch.setattr(onnx_quant, "fold_input_affine_file", lambda *args: [])
        else:
            monkeypatch.undo()
        out = tmp_path / f"{route}.onnx"
        onnx_quant.quantize_onnx_static(path, out, batches)
        got = run(out, val)
        scores[route] = (np.mean(got.argmax(1) == reference.argmax(1)),
                         np.abs(softmax(got) - softmax(reference)).max())
        # where the error enters, read from the file: the stem conv's output "s"
        errors = layer_errors(path, out, {"image": val})
        stem[route] = errors["s"]
    assert scores["unfolded"][0] < 0.5 and scores["unfolded"][1] > 0.25, scores
    assert scores["folded"][0] >= 0.97 and scores["folded"][1] < 0.2, scores
    assert stem["unfolded"] > 0.1 and stem["folded"] < 0.03, stem
    ops = [node.op_type for node in onnx.load(str(tmp_path / "folded.onnx")).graph.node]
    # int8 quantizes the raw image: nothing but Q / DQ and the layout transpose before the stem
    assert set(ops[:ops.index("Conv")]) == {"QuantizeLinear", "DequantizeLinear", "Transpose"}


def test_float16_of_images_the_preprocessing_does_not_expect(net, monkeypatch):
    """float16 rounds the narrow band too: max softmax diff 0.0080 unfolded, 0.0010 folded
    (keras.applications EfficientNetV2B0 on [0, 1] images: accuracy 0.951 -> 0.963 = float32)."""
    from types import SimpleNamespace

    from compressor.export import onnx_input_fold
    from compressor.export.onnx import float16_onnx

    path, _, val, _ = net
    reference = softmax(run(path, val))
    scheme = SimpleNamespace(exclude=(), keep_io_types=True)
    folded = softmax(run(float16_onnx(onnx.load(str(path)), scheme), val))
    monkeypatch.setattr(onnx_input_fold, "fold_input_affine", lambda *args: [])
    unfolded = softmax(run(float16_onnx(onnx.load(str(path)), scheme), val))
    assert np.abs(unfolded - reference).max() > 0.004
    assert np.abs(folded - reference).max() < 0.002

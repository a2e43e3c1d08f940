"""A MobileNetV3-shaped ONNX net built with numpy weights (no TensorFlow): in-model
preprocessing as keras.applications writes it (NHWC input, Rescaling(1/255), per-channel
Normalization, Transpose), stem conv + hard-swish, depthwise conv, squeeze-excite with a
hard-sigmoid gate, projection, logits from the flattened map.

Weights are random; every conv's outputs are then standardized per channel on the given
images (what trained BatchNorm does, folded into the conv), so each layer carries signal
whatever scale the images have. Fed images in [0, 1] (what a new user often passes to a model
that rescales [0, 255]), the stem conv's input is the narrow band keras.applications nets see
then: about [-2.118, -2.101] per channel."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
WIDTH, CLASSES = 16, 4


def _conv(name: str, x: str, out: str, weight: str, group: int = 1, stride: int = 1,
          pad: int = 0) -> onnx.NodeProto:
    return helper.make_node("Conv", [x, weight, f"{weight}_b"], [out], name=name, group=group,
                            strides=[stride, stride], pads=[pad] * 4)


def _hard_sigmoid(x: str, out: str) -> list[onnx.NodeProto]:
    return [helper.make_node("Add", [x, "three"], [f"{out}_p3"]),
            helper.make_node("Clip", [f"{out}_p3", "zero", "six"], [f"{out}_r6"]),
            helper.make_node("Mul", [f"{out}_r6", "sixth"], [out])]


def mobilenet_like(path: Path, images: np.ndarray, labels: np.ndarray, seed: int = 0) -> Path:
    """The net at `path`, standardized on `images` (N, H, W, 3), its head fit to `labels`."""
    rng = np.random.default_rng(seed)
    c = WIDTH
    nodes = [
        helper.make_node("Mul", ["image", "rescale"], ["scaled"], name="rescaling/mul"),
        helper.make_node("Sub", ["scaled", "mean"], ["centered"], name="normalization/sub"),
        helper.make_node("Div", ["centered", "std"], ["normalized"], name="normalization/div"),
        helper.make_node("Transpose", ["normalized"], ["nchw"], perm=[0, 3, 1, 2]),
        _conv("stem", "nchw", "s", "stem_w", stride=2, pad=1),
        *_hard_sigmoid("s", "s_gate"), helper.make_node("Mul", ["s", "s_gate"], ["s_act"]),
        _conv("depthwise", "s_act", "d", "dw_w", group=c, pad=1),
        helper.make_node("Relu", ["d"], ["d_act"]),
        helper.make_node("GlobalAveragePool", ["d_act"], ["se_in"]),
        _conv("se_reduce", "se_in", "se_r", "se1_w"), helper.make_node("Relu", ["se_r"], ["se_a"]),
        _conv("se_expand", "se_a", "se_e", "se2_w"), *_hard_sigmoid("se_e", "se_gate"),
        helper.make_node("Mul", ["d_act", "se_gate"], ["excited"]),
        _conv("project", "excited", "p", "proj_w"),
        helper.make_node("Flatten", ["p"], ["flat"]),     # spatial head: where the quadrant is
        helper.make_node("Gemm", ["flat", "head_w", "head_b"], ["logits"], name="logits"),
    ]
    shapes = {"stem_w": (c, 3, 3, 3), "dw_w": (c, 1, 3, 3), "se1_w": (c // 2, c, 1, 1),
              "se2_w": (c, c // 2, 1, 1), "proj_w": (24, c, 1, 1)}
    weights = {name: rng.normal(0, 1 / np.sqrt(np.prod(shape[1:])), shape)
               for name, shape in shapes.items()}
    weights |= {f"{name}_b": np.zeros(shape[0]) for name, shape in shapes.items()}
    features = 24 * (images.shape[1] // 2) * (images.shape[2] // 2)
    weights |= {"head_w": rng.normal(0, 1 / np.sqrt(features), (features, CLASSES)),
                "head_b": np.zeros(CLASSES)}
    constants = {"rescale": np.array(1 / 255), "mean": np.array(MEAN), "std": np.array(STD),
                 "three": np.array(3.0), "zero": np.array(0.0), "six": np.array(6.0),
                 "sixth": np.array(1 / 6)}
    shape = ["n", *images.shape[1:]]

    def build() -> onnx.ModelProto:
        inits = [numpy_helper.from_array(np.asarray(v, np.float32), k)
                 for k, v in (weights | constants).items()]
        graph = helper.make_graph(
            nodes, "mobilenet_like", [helper.make_tensor_value_info("image", TensorProto.FLOAT, shape)],
            [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", CLASSES])], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        return model

    for name, weight in (("s", "stem_w"), ("d", "dw_w"), ("p", "proj_w")):
        out = _run(build(), name, images)
        mean, std = out.mean((0, 2, 3)), out.std((0, 2, 3)) + 1e-6
        weights[weight] = weights[weight] / std[:, None, None, None]
        weights[f"{weight}_b"] = (weights[f"{weight}_b"] - mean) / std
    # the head: ridge regression of the labels (one-hot, x4) on the features, so logits carry
    # what the features know about the label, as a trained head's do
    features = _run(build(), "flat", images)
    centre = features.mean(0)
    centred = features - centre
    targets = 4.0 * (np.eye(CLASSES)[labels] - 1 / CLASSES)
    gram = centred.T @ centred + len(images) * np.eye(len(centre))
    weights["head_w"] = np.linalg.solve(gram, centred.T @ targets)
    weights["head_b"] = -centre @ weights["head_w"]
    model = build()
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _run(model: onnx.ModelProto, tensor: str, images: np.ndarray) -> np.ndarray:
    model.graph.output.append(helper.make_tensor_value_info(tensor, TensorProto.FLOAT, None))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run([tensor], {"image": images.astype(np.float32)})[0].astype(np.float64)


def quadrant_images(count: int, size: int = 16, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """NHWC images in [0, 1] with one brighter quadrant each, and which quadrant."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 0.55, (count, size, size, 3))
    labels = rng.integers(0, 4, count)
    half = size // 2
    for i, label in enumerate(labels):
        row, col = divmod(int(label), 2)
        x[i, row * half:(row + 1) * half, col * half:(col + 1) * half] += 0.2 + 0.2 * rng.random()
    return x.astype(np.float32), labels

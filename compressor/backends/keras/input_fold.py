"""In-model input preprocessing folded into the stem conv before int8 (TFLite ptq, and QAT of
either format): the Keras twin of export/onnx_input_fold.py, which says why; the algebra is
the same.

keras.applications nets start Input -> Rescaling / Normalization -> Conv2D -> BatchNorm. Fed
images scaled otherwise than the preprocessing expects ([0, 1] into a net that rescales
[0, 255]), the stem conv reads a narrow band far from zero that int8 gives a few levels. The
folded model has the preprocessing (y = a*x + b per channel) and the BatchNorm in the conv's
kernel and bias, and zero padding's border effect (the padded zeros of y are -b/a in x) as a
constant map subtracted by a Normalization layer (mean = -map, variance 1) where the
BatchNorm was; the preprocessing layers become identities. Built-in layers only, so tfmot's
QAT wraps it and TFLiteConverter converts it. The map replaces the BatchNorm rather than
following the conv because the converter folds a BatchNorm only into the conv right before
it: a conv -> map -> BatchNorm chain would leave the conv's output a narrow band again.

Measured (keras.applications MobileNetV3Small, 64x64, fed [0, 1]): TFLite ptq accuracy 0.54
-> 0.94 (float 1.0); int8_qat, whose fake-quant rounded the band during training, 0.27 ->
1.0. Only where the calibration samples show the narrow band (export/input_band.py) and the
folded model computes what the original does on them; otherwise the model is used as it is.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from compressor.backends.keras.env import import_tensorflow, import_tf_keras
from compressor.backends.keras.io import predict
from compressor.export.input_band import channel_constants, is_narrow
from compressor.core.tensors import output_list

PREPROCESSING = ("Rescaling", "Normalization")
TOLERANCE = 1e-4   # max |folded - original| over the outputs, relative to their max |value|
CHECK_ROWS = 32

_FOLDED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass
class Stem:
    """The layers a fold replaces: preprocessing chain, conv, and the BatchNorm after it."""
    chain: list[Any]
    conv: Any
    norm: Any | None


def input_folded(model: Any, samples: Callable[[], dict[str, np.ndarray]]) -> Any:
    """`model` with its input preprocessing folded into the stem conv where `samples()` (input
    name -> training batch; asked only of a model with such a stem) show a narrow band; else
    `model` itself. Kept per model, so a fallback search that converts one model many times
    folds it once."""
    if model not in _FOLDED:
        _FOLDED[model] = _folded(model, samples) or model
    return _FOLDED[model]


def _folded(model: Any, samples: Callable[[], dict[str, np.ndarray]]) -> Any | None:
    if len(model.inputs) != 1 or len(model.inputs[0].shape) != 4 \
            or None in model.inputs[0].shape[1:]:
        return None   # the border map is sized for one image size
    stem = _stem(model)
    if stem is None:
        return None
    batch = next(iter(samples().values()), None)
    if batch is None or not is_narrow(_apply(stem.chain, batch[:CHECK_ROWS]), -1):
        return None
    a, b = _affine(stem.chain, batch.shape[1:])
    if a is None or b is None or np.any(a == 0):
        return None
    kernel, bias, border = _folded_weights(stem, a, b, batch.shape[1:])
    if stem.norm is None and np.abs(border).max() > 1e-6 * max(np.abs(bias).max(), 1e-12):
        return None   # zero padding's border map needs the BatchNorm's place
    folded = _clone_with(model, stem, border)
    for old, new in zip(model.layers, folded.layers):
        if old is stem.conv:
            new.set_weights([kernel.astype(np.float32), bias.astype(np.float32)])
        elif old not in stem.chain and old is not stem.norm:
            new.set_weights(old.get_weights())
    check = batch[:CHECK_ROWS]
    want, got = output_list(predict(model, check)), output_list(predict(folded, check))
    if not all(np.abs(g - w).max() <= TOLERANCE * max(np.abs(w).max(), 1e-12)
               for g, w in zip(got, want)):
        return None
    return folded


def _stem(model: Any) -> Stem | None:
    """Input -> Rescaling / Normalization (at least one) -> Conv2D [-> BatchNormalization],
    each the only reader of the layer before it."""
    layers = {layer.name: layer for layer in model.layers}
    readers = _readers(model)
    outputs = set(model.output_names)
    chain, name = [], model.input_names[0]
    while len(readers.get(name, [])) == 1 and name not in outputs:
        name = readers[name][0]
        if type(layers[name]).__name__ not in PREPROCESSING:
            break
        chain.append(layers[name])
    conv = layers.get(name)
    if not chain or type(conv).__name__ != "Conv2D" or conv in chain or conv.groups != 1 \
            or conv.name in outputs:
        return None
    after = readers.get(conv.name, [])
    norm = layers[after[0]] if len(after) == 1 else None
    if (type(norm).__name__ != "BatchNormalization" or conv.get_config()["activation"] != "linear"
            or list(np.atleast_1d(norm.axis)) not in ([3], [-1])):
        norm = None
    return Stem(chain, conv, norm)


def _readers(model: Any) -> dict[str, list[str]]:
    """Layer name -> the names of the layers that read its output (the model's layer graph,
    which Sequential models keep too)."""
    tf = import_tensorflow()
    readers: dict[str, list[str]] = {}
    for layer in model.layers:
        for node in layer.inbound_nodes:
            for inbound in tf.nest.flatten(node.inbound_layers):
                readers.setdefault(inbound.name, []).append(layer.name)
    return readers


def _apply(layers: list[Any], x: np.ndarray) -> np.ndarray:
    for layer in layers:
        x = layer(x)
    return np.asarray(x, dtype=np.float64)


def _affine(chain: list[Any], shape: tuple[int, ...]) -> tuple[np.ndarray | None, ...]:
    """Per-channel (a, b) of y = a*x + b, or None where the chain is not that."""
    zero = _apply(chain, np.zeros((1, *shape), np.float32))[0]
    one = _apply(chain, np.ones((1, *shape), np.float32))[0]
    b = channel_constants(zero, -1)
    a = channel_constants(one - zero, -1) if b is not None else None
    return a, b


def _folded_weights(stem: Stem, a: np.ndarray, b: np.ndarray,
                    shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """conv(a*x + b) [then BatchNorm] = conv'(x) + bias' + border: kernel', bias', border."""
    tf = import_tensorflow()
    weights = stem.conv.get_weights()
    kernel = weights[0].astype(np.float64)                        # (kh, kw, in, out)
    bias = weights[1].astype(np.float64) if stem.conv.use_bias else np.zeros(kernel.shape[-1])
    constant = (kernel * b[None, None, :, None]).sum(axis=(0, 1, 2))
    image = np.broadcast_to(b.astype(np.float32), (1, *shape))
    border = tf.nn.convolution(image, kernel.astype(np.float32), strides=stem.conv.strides,
                               padding=stem.conv.padding.upper(),
                               dilations=stem.conv.dilation_rate).numpy()[0] - constant
    kernel, bias = kernel * a[None, None, :, None], bias + constant
    if stem.norm is not None:
        scale, shift = _norm_affine(stem.norm)
        kernel, bias, border = kernel * scale, bias * scale + shift, border * scale
    return kernel, bias, border


def _norm_affine(norm: Any) -> tuple[np.ndarray, np.ndarray]:
    """Inference-mode BatchNormalization as scale, shift per channel."""
    weights = [w.astype(np.float64) for w in norm.get_weights()]
    gamma = weights.pop(0) if norm.scale else 1.0
    beta = weights.pop(0) if norm.center else 0.0
    mean, variance = weights
    scale = gamma / np.sqrt(variance + norm.epsilon)
    return scale, beta - mean * scale


def _clone_with(model: Any, stem: Stem, border: np.ndarray) -> Any:
    """A copy with the stem's layers swapped (weights set by the caller)."""
    keras = import_tf_keras()

    def clone(layer: Any) -> Any:
        if layer in stem.chain:
            return keras.layers.Activation("linear", name=layer.name)
        if layer is stem.conv:
            return keras.layers.Conv2D.from_config({**layer.get_config(), "use_bias": True})
        if layer is stem.norm:
            return keras.layers.Normalization(axis=(1, 2, 3), mean=-border,
                                              variance=np.ones_like(border), name=layer.name)
        return layer.__class__.from_config(layer.get_config())

    return keras.models.clone_model(model, clone_function=clone)

"""Tiny tf_keras models for tests, trained inside the tests (no downloaded weights).

Importing this module does not import TensorFlow; the builders do, lazily.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from compressor.core.context import Data


def tf_keras():
    from compressor.backends.keras.env import import_tf_keras

    return import_tf_keras()


def digits_cnn(seed: int = 0, softmax: bool = False) -> Any:
    """A small 8x8x1 CNN with a logits (or softmax) head: about 39k parameters."""
    keras = tf_keras()
    keras.utils.set_random_seed(seed)
    layers = keras.layers
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        layers.Conv2D(16, 3, activation="relu"),
        layers.Conv2D(32, 3, activation="relu"),
        layers.Flatten(),
        layers.Dense(64, activation="relu"),
        layers.Dense(10, activation="softmax" if softmax else None),
    ], name="digits_cnn")


def digits_functional(seed: int = 0) -> Any:
    """A Functional CNN with BatchNorm and a skip connection (not a plain Sequential)."""
    keras = tf_keras()
    keras.utils.set_random_seed(seed)
    layers = keras.layers
    inputs = keras.Input((8, 8, 1))
    x = layers.Conv2D(16, 3, padding="same", use_bias=False)(inputs)
    x = layers.ReLU()(layers.BatchNormalization()(x))
    skip = x
    x = layers.Conv2D(16, 3, padding="same", activation="relu")(x)
    x = layers.Add()([x, skip])
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(10)(x), name="digits_functional")


def train(model: Any, data: Data, epochs: int = 8, lr: float = 3e-3, seed: int = 0) -> Any:
    keras = tf_keras()
    keras.utils.set_random_seed(seed)
    x, y = data.train
    from_logits = model.layers[-1].get_config().get("activation") != "softmax"
    model.compile(keras.optimizers.Adam(lr),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits))
    model.fit(x, y, epochs=epochs, batch_size=32, verbose=0)
    return model


def accuracy(outputs: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(np.argmax(outputs, axis=-1) == labels))


def run_tflite(path: Path, x: np.ndarray) -> np.ndarray:
    """Float outputs of a .tflite in LiteRT for float inputs (int8 I/O (de)quantized here)."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    inp, out = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    interpreter.resize_tensor_input(inp["index"], x.shape)
    interpreter.allocate_tensors()
    feed = x
    if inp["dtype"] == np.int8:
        scale, zero = inp["quantization"]
        feed = np.clip(np.round(x / scale + zero), -128, 127).astype(np.int8)
    interpreter.set_tensor(inp["index"], feed.astype(inp["dtype"]))
    interpreter.invoke()
    result = interpreter.get_tensor(out["index"])
    if out["dtype"] == np.int8:
        scale, zero = out["quantization"]
        result = (result.astype(np.float32) - zero) * scale
    return result


def run_onnx(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def tflite_kernel_weights(path: Path) -> list[np.ndarray]:
    """The weight tensors of every conv / depthwise conv / dense op, read back from the file."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    interpreter = Interpreter(model_path=str(path), experimental_op_resolver_type=(
        OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES))
    interpreter.allocate_tensors()
    kernel_ops = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")
    weights = []
    for op in interpreter._get_ops_details():
        if op["op_name"] in kernel_ops:
            weight_index = op["inputs"][1]
            weights.append(_tflite_constant(interpreter, weight_index))
    return weights


def _tflite_constant(interpreter: Any, index: int) -> np.ndarray:
    details = {t["index"]: t for t in interpreter.get_tensor_details()}
    tensor = details[index]
    if tensor["dtype"] == np.float32 and "dequantize" not in tensor["name"].lower():
        # fp16 models feed float32 kernels from a DEQUANTIZE op: report the float16 source.
        for op in interpreter._get_ops_details():
            if op["op_name"] == "DEQUANTIZE" and index in op["outputs"]:
                return interpreter.get_tensor(op["inputs"][0])
    return interpreter.get_tensor(index)


def onnx_kernel_weights(path: Path) -> list[np.ndarray]:
    """Initializers feeding the weight input of Conv / MatMul / Gemm (through DequantizeLinear)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    initializers = {i.name: i for i in model.graph.initializer}
    producers = {out: node for node in model.graph.node for out in node.output}
    weights = []
    for node in model.graph.node:
        if node.op_type not in ("Conv", "MatMul", "Gemm"):
            continue
        name = node.input[1]
        while name in producers and producers[name].op_type in ("DequantizeLinear", "Cast"):
            name = producers[name].input[0]
        if name in initializers:
            weights.append(numpy_helper.to_array(initializers[name]))
    return weights


def zero_fraction(tensors: list[np.ndarray]) -> float:
    total = sum(t.size for t in tensors)
    return float(sum(int(np.count_nonzero(t == 0)) for t in tensors) / total)


SEQUENCE_VOCAB, SEQUENCE_LENGTH = 20, 8


def token_data(train: int = 600, val: int = 200, seed: int = 0) -> Data:
    """Synthetic int32 token sequences: is token 3 more frequent than token 7? Order does not
    matter, so a recurrent and an attention model both learn it in a couple of epochs."""
    rng = np.random.default_rng(seed)
    x = rng.integers(1, SEQUENCE_VOCAB, (train + val, SEQUENCE_LENGTH)).astype(np.int32)
    y = ((x == 3).sum(1) > (x == 7).sum(1)).astype(np.int64)
    return Data(train=(x[:train], y[:train]), val=(x[train:], y[train:]))


def token_rnn(kind: str, seed: int = 0, length: int | None = SEQUENCE_LENGTH) -> Any:
    """Embedding + LSTM / GRU / SimpleRNN (as users build it: unroll=False) + logits."""
    keras = tf_keras()
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((length,), dtype="int32"),
        keras.layers.Embedding(SEQUENCE_VOCAB, 16),
        getattr(keras.layers, kind)(32),
        keras.layers.Dense(2),
    ], name=f"token_{kind.lower()}")


def token_encoder(seed: int = 0) -> Any:
    """A one-block transformer encoder on int32 ids: MultiHeadAttention, LayerNormalization,
    exact GELU (Keras writes it with Erfc), mean pooling, logits."""
    keras = tf_keras()
    keras.utils.set_random_seed(seed)
    layers = keras.layers
    ids = keras.Input((SEQUENCE_LENGTH,), dtype="int32")
    x = layers.Embedding(SEQUENCE_VOCAB, 32)(ids)
    x = layers.LayerNormalization()(x + layers.MultiHeadAttention(2, 16)(x, x))
    feed_forward = layers.Dense(32)(layers.Dense(64, activation="gelu")(x))
    x = layers.LayerNormalization()(x + feed_forward)
    logits = layers.Dense(2)(layers.GlobalAveragePooling1D()(x))
    return keras.Model(ids, logits, name="token_encoder")


def resnet_style(seed: int = 0) -> Any:
    """A tiny ResNet: Conv+BatchNorm stem, an identity block and a strided block with a 1x1
    projection shortcut (residual Adds joining channel groups), global pooling, dense head."""
    keras = tf_keras()
    keras.utils.set_random_seed(seed)
    layers = keras.layers

    def conv_bn(x, filters, kernel=3, strides=1, relu=True):
        x = layers.Conv2D(filters, kernel, strides, padding="same", use_bias=False)(x)
        x = layers.BatchNormalization(momentum=0.9)(x)   # PyTorch's default
        return layers.ReLU()(x) if relu else x

    inputs = keras.Input((8, 8, 1))
    x = conv_bn(inputs, 24)
    x = layers.ReLU()(layers.Add()([x, conv_bn(conv_bn(x, 24), 24, relu=False)]))
    shortcut = conv_bn(x, 48, 1, 2, relu=False)
    x = layers.ReLU()(layers.Add()([shortcut, conv_bn(conv_bn(x, 48, strides=2), 48, relu=False)]))
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(10)(x), name="resnet_style")


def mobilenet_v2_style(seed: int = 0) -> Any:
    """A tiny MobileNetV2: inverted residual blocks (1x1 expand, depthwise 3x3, 1x1 project,
    BatchNorm + ReLU6, skip Adds where shapes match), global pooling, dense head."""
    keras = tf_keras()
    keras.utils.set_random_seed(seed)
    layers = keras.layers

    def bn_act(x, act=True):
        x = layers.BatchNormalization(momentum=0.9)(x)   # PyTorch's default
        return layers.ReLU(6.0)(x) if act else x

    def inverted(x, expand, out, strides=1):
        y = bn_act(layers.Conv2D(expand, 1, use_bias=False)(x))
        y = bn_act(layers.DepthwiseConv2D(3, strides, padding="same", use_bias=False)(y))
        y = bn_act(layers.Conv2D(out, 1, use_bias=False)(y), act=False)
        return layers.Add()([x, y]) if strides == 1 and x.shape[-1] == out else y

    inputs = keras.Input((8, 8, 1))
    x = bn_act(layers.Conv2D(16, 3, padding="same", use_bias=False)(inputs))
    x = inverted(x, 48, 16)
    x = inverted(x, 48, 32, strides=2)
    x = inverted(x, 96, 32)
    x = bn_act(layers.Conv2D(96, 1, use_bias=False)(x))
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(10)(x), name="mobilenet_v2_style")

"""Tiny tf_keras nets built the way keras.applications builds MobileNetV3, EfficientNetV2 and
DenseNet (no download, trained inside the tests):

- hard-swish and hard-sigmoid as scalar arithmetic, `x * ReLU6(x + 3.0) * (1.0 / 6.0)`: tf_keras
  stores `x + 3.0` and `x * (1 / 6)` as TFOpLambda layers;
- layer names holding '/', with a stem named "Conv" and squeeze-excite convs named
  ".../squeeze_excite/Conv" (MobileNetV3);
- in-model preprocessing: Rescaling then Normalization (EfficientNetV2);
- a BatchNormalization that follows a Concatenate, not a conv (DenseNet's pre-activation);
- squeeze-excite convs with their swish / sigmoid activation inside the conv (EfficientNetV2).

Importing this module does not import TensorFlow.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from compressor.core.context import Data

SIZE, CLASSES = 16, 4


def quadrant_data(train: int = 320, val: int = 160, seed: int = 0) -> Data:
    """RGB images in [0, 255]: the class is the brighter quadrant (learnable in a few epochs)."""
    rng = np.random.default_rng(seed)
    count = train + val
    x = rng.uniform(0, 140, (count, SIZE, SIZE, 3)).astype(np.float32)
    y = rng.integers(0, CLASSES, count)
    half = SIZE // 2
    for i, label in enumerate(y):
        row, col = divmod(int(label), 2)
        x[i, row * half:(row + 1) * half, col * half:(col + 1) * half] += 60 + 50 * rng.random()
    return Data(train=(x[:train], y[:train].astype(np.int64)),
                val=(x[train:], y[train:].astype(np.int64)))


def applications_like(seed: int = 0) -> Any:
    """Rescaling -> Normalization -> Conv "Conv" + BN + hard-swish -> depthwise + BN +
    hard-swish -> squeeze-excite ("expanded_conv/squeeze_excite/Conv", hard-sigmoid) ->
    project conv + BN -> Concatenate -> BN -> ReLU -> squeeze-excite (swish / sigmoid convs)
    -> 1x1 conv -> average pool (DenseNet's transition) -> global pooling -> logits."""
    from compressor.backends.keras.env import import_tf_keras

    keras = import_tf_keras()
    keras.utils.set_random_seed(seed)
    layers = keras.layers

    def hard_sigmoid(x):
        return layers.ReLU(6.0)(x + 3.0) * (1.0 / 6.0)

    def hard_swish(x):
        return layers.Multiply()([x, hard_sigmoid(x)])

    def bn(x, name):
        return layers.BatchNormalization(epsilon=1e-3, momentum=0.9, name=name)(x)

    inputs = keras.Input((SIZE, SIZE, 3))
    x = layers.Rescaling(1.0 / 255)(inputs)
    x = layers.Normalization(mean=[0.485, 0.456, 0.406], variance=[0.052, 0.050, 0.051])(x)
    x = layers.Conv2D(16, 3, strides=2, padding="same", use_bias=False, name="Conv")(x)
    x = hard_swish(bn(x, "Conv/BatchNorm"))
    y = layers.DepthwiseConv2D(3, padding="same", use_bias=False,
                               name="expanded_conv/depthwise")(x)
    y = hard_swish(bn(y, "expanded_conv/depthwise/BatchNorm"))
    se = layers.GlobalAveragePooling2D(keepdims=True)(y)
    se = layers.ReLU()(layers.Conv2D(8, 1, name="expanded_conv/squeeze_excite/Conv")(se))
    se = layers.Conv2D(16, 1, name="expanded_conv/squeeze_excite/Conv_1")(se)
    y = layers.Multiply()([y, hard_sigmoid(se)])
    y = bn(layers.Conv2D(16, 1, use_bias=False, name="expanded_conv/project")(y),
           "expanded_conv/project/BatchNorm")
    x = layers.Concatenate()([x, y])
    x = layers.ReLU()(bn(x, "transition/BatchNorm"))            # BN after a concat
    se = layers.GlobalAveragePooling2D(keepdims=True)(x)        # EfficientNetV2's SE convs
    se = layers.Conv2D(8, 1, activation="swish", name="block_se_reduce")(se)
    x = layers.Multiply()([x, layers.Conv2D(32, 1, activation="sigmoid",
                                            name="block_se_expand")(se)])
    x = layers.Conv2D(24, 1, name="Conv_1")(x)
    x = layers.AveragePooling2D(2, name="pool")(x)              # DenseNet's transition pool
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(CLASSES, name="Logits")(x), name="applications_like")


def trained(data: Data, epochs: int = 10, seed: int = 0) -> Any:
    from support import keras_models as km

    return km.train(applications_like(seed), data, epochs=epochs, lr=3e-3, seed=seed)


def unit_images(data: Data) -> Data:
    """The images scaled to [0, 1]: what many pipelines feed, not what a keras.applications
    net's Rescaling expects ([0, 255])."""
    return Data(train=(data.train[0] / 255.0, data.train[1]), val=(data.val[0] / 255.0, data.val[1]))

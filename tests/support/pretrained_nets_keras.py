"""tf_keras Functional nets trained from scratch to high accuracy on digits, for the
pretrained fine-tuning acceptance test (tests/test_pretrained_finetune_keras.py).

The ResNet- and MobileNetV2-style builders are tests/support/keras_models' (BatchNorm, skip Adds,
depthwise convs, ReLU6); the MLP is here. Importing this module does not import TensorFlow.
"""
from __future__ import annotations

import math
from typing import Any

from support import keras_models as km

from compressor.core.context import Data


NETS = ("resnet_style", "mobilenet_v2_style", "mlp")
TRAIN_EPOCHS = {"resnet_style": 6, "mobilenet_v2_style": 8, "mlp": 20}


def mlp(seed: int = 0) -> Any:
    """Flatten, two hidden Dense ReLU layers, logits: a Functional MLP."""
    keras = km.tf_keras()
    keras.utils.set_random_seed(seed)
    layers = keras.layers
    inputs = keras.Input((8, 8, 1))
    x = layers.Dense(128, activation="relu")(layers.Flatten()(inputs))
    x = layers.Dense(64, activation="relu")(x)
    return keras.Model(inputs, layers.Dense(10)(x), name="mlp")


def pretrained(net: str, data: Data, seed: int = 0) -> Any:
    """`net` built and fitted from scratch on digits' train split as one trains a model to
    convergence: Adam at 3e-3 decayed to 0 along a cosine, batch 32."""
    keras = km.tf_keras()
    model = mlp(seed) if net == "mlp" else getattr(km, net)(seed)
    keras.utils.set_random_seed(seed)
    x, y = data.train
    epochs = TRAIN_EPOCHS[net]
    lr = keras.optimizers.schedules.CosineDecay(3e-3, epochs * math.ceil(len(x) / 32))
    model.compile(keras.optimizers.Adam(lr),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, epochs=epochs, batch_size=32, verbose=0)
    return model

"""The bench's conv nets, one layer list per net, built in tf_keras (NHWC) or PyTorch (NCHW).

A net is a tuple of layers: ("conv", channels) 3x3 same-padded + ReLU, ("pool",) 2x2 max pool,
("gap",) global average pool, ("flatten",), ("dense", units) + ReLU; a final Dense(10) gives
the logits. The same list builds the same architecture (same parameter count) in both
frameworks. Framework imports happen inside the builders only.
"""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class NetSpec:
    name: str
    input_hw: int            # square input, height = width
    in_channels: int
    layers: tuple
    data: str                # "digits" (trained on it) or "random" (random inputs, untrained)
    train_epochs: int = 0    # epochs on digits before the bench compresses it; 0 = untrained

    def params(self) -> int:
        """Parameter count of the built net, computed from the layer list."""
        channels, hw, flat, total = self.in_channels, self.input_hw, None, 0
        for layer in self.layers:
            kind = layer[0]
            if kind == "conv":
                total += channels * layer[1] * 9 + layer[1]
                channels = layer[1]
            elif kind == "pool":
                hw //= 2
            elif kind == "gap":
                flat = channels
            elif kind == "flatten":
                flat = channels * hw * hw
            elif kind == "dense":
                total += flat * layer[1] + layer[1]
                flat = layer[1]
        return total + flat * 10 + 10


# The Keras digits net is compressor.backends.examples.keras_digits_cnn; DIGITS mirrors it.
DIGITS = NetSpec("digits", 8, 1, (("conv", 16), ("conv", 32), ("pool",), ("flatten",),
                                  ("dense", 64)), "digits", train_epochs=8)
CONV32 = NetSpec("conv32", 32, 3, (("conv", 64), ("pool",), ("conv", 128), ("pool",),
                                   ("conv", 128), ("gap",)), "random")
CONV_1M = NetSpec("conv1m", 8, 1, (("conv", 64), ("conv", 128), ("pool",), ("conv", 256),
                                   ("conv", 256), ("pool",), ("flatten",), ("dense", 256)),
                  "digits", train_epochs=4)
# Scaling series: same shape family, width scaled; untrained (PTQ cost does not depend on it).
SCALE_01M = NetSpec("scale_0.1m", 8, 1, (("conv", 32), ("conv", 64), ("pool",), ("conv", 96),
                                         ("pool",), ("flatten",), ("dense", 64)), "digits")
SCALE_1M = NetSpec("scale_1m", 8, 1, CONV_1M.layers, "digits")
SCALE_10M = NetSpec("scale_10m", 8, 1, (("conv", 192), ("conv", 384), ("pool",), ("conv", 768),
                                        ("conv", 768), ("pool",), ("flatten",), ("dense", 512)),
                    "digits")

NETS = {spec.name: spec for spec in (DIGITS, CONV32, CONV_1M, SCALE_01M, SCALE_1M, SCALE_10M)}


def build_keras(spec: NetSpec, seed: int = 0):
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tf_keras as keras

    keras.utils.set_random_seed(seed)
    layers = [keras.Input((spec.input_hw, spec.input_hw, spec.in_channels))]
    for layer in spec.layers:
        kind = layer[0]
        if kind == "conv":
            layers.append(keras.layers.Conv2D(layer[1], 3, padding="same", activation="relu"))
        elif kind == "pool":
            layers.append(keras.layers.MaxPooling2D())
        elif kind == "gap":
            layers.append(keras.layers.GlobalAveragePooling2D())
        elif kind == "flatten":
            layers.append(keras.layers.Flatten())
        elif kind == "dense":
            layers.append(keras.layers.Dense(layer[1], activation="relu"))
    layers.append(keras.layers.Dense(10))
    return keras.Sequential(layers, name=spec.name.replace(".", "_"))


def build_torch(spec: NetSpec, seed: int = 0):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    modules, channels, hw, flat = [], spec.in_channels, spec.input_hw, None
    for layer in spec.layers:
        kind = layer[0]
        if kind == "conv":
            modules += [nn.Conv2d(channels, layer[1], 3, padding=1), nn.ReLU()]
            channels = layer[1]
        elif kind == "pool":
            modules.append(nn.MaxPool2d(2))
            hw //= 2
        elif kind == "gap":
            modules += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
            flat = channels
        elif kind == "flatten":
            modules.append(nn.Flatten())
            flat = channels * hw * hw
        elif kind == "dense":
            modules += [nn.Linear(flat, layer[1]), nn.ReLU()]
            flat = layer[1]
    modules.append(nn.Linear(flat, 10))
    return nn.Sequential(*modules)


# module:function references for the toolkit's `compress bench.nets:torch_digits --weights W`
def torch_digits():
    return build_torch(DIGITS)


def torch_conv32():
    return build_torch(CONV32)


def torch_conv1m():
    return build_torch(CONV_1M)

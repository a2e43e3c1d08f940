"""The zoo case's CNNs, built the same way in PyTorch (NCHW) and tf_keras (NHWC), random init:
ResNet-18-style (BatchNorm, skip Adds), MobileNetV2-style (depthwise, ReLU6, inverted
residuals) and EfficientNet-B0-style (depthwise, swish, squeeze-and-excitation). Input 64x64x3,
10 classes. Framework imports happen inside the builders only.

A block list per net, the same list for both frameworks:
- ResNet: ("basic", out, stride): two 3x3 conv+BN, ReLU, skip (1x1 conv+BN when shapes change).
- MobileNet/EfficientNet: ("mb", out, stride, expand, kernel, se): 1x1 expand conv+BN+act,
  kxk depthwise+BN+act, optional squeeze-excite, 1x1 project conv+BN, skip when shapes match.
"""
from __future__ import annotations

import os

INPUT_HW, CLASSES = 64, 10

# Lighter than the originals (half-width ResNet, one block fewer per repeated stage in the
# MobileNets) so the case builds 12 toolkit artifacts per framework in minutes on 2 cores;
# each keeps its family's ops: BatchNorm + skip Adds, depthwise + ReLU6 inverted residuals,
# depthwise + swish + squeeze-excite.
RESNET18 = ("resnet18", "relu", 32, [("basic", 32, 1), ("basic", 32, 1), ("basic", 64, 2),
                                     ("basic", 64, 1), ("basic", 128, 2), ("basic", 128, 1),
                                     ("basic", 256, 2), ("basic", 256, 1)])
MOBILENETV2 = ("mobilenetv2", "relu6", 32, [
    ("mb", 16, 1, 1, 3, False), ("mb", 24, 2, 6, 3, False), ("mb", 24, 1, 6, 3, False),
    ("mb", 32, 2, 6, 3, False), ("mb", 32, 1, 6, 3, False), ("mb", 64, 2, 6, 3, False),
    ("mb", 96, 1, 6, 3, False), ("mb", 160, 2, 6, 3, False), ("mb", 320, 1, 6, 3, False)])
EFFICIENTNETB0 = ("efficientnetb0", "swish", 32, [
    ("mb", 16, 1, 1, 3, True), ("mb", 24, 2, 6, 3, True), ("mb", 24, 1, 6, 3, True),
    ("mb", 40, 2, 6, 5, True), ("mb", 40, 1, 6, 5, True), ("mb", 80, 2, 6, 3, True),
    ("mb", 112, 1, 6, 5, True), ("mb", 192, 2, 6, 5, True), ("mb", 320, 1, 6, 3, True)])
ZOO = {spec[0]: spec for spec in (RESNET18, MOBILENETV2, EFFICIENTNETB0)}


def build_torch(spec: tuple, seed: int = 0, in_channels: int = 3):
    import torch
    from torch import nn

    name, act, stem, blocks = spec
    torch.manual_seed(seed)
    activation = {"relu": nn.ReLU, "relu6": nn.ReLU6, "swish": nn.SiLU}[act]

    def conv_bn(cin, cout, k, stride=1, groups=1, with_act=True):
        layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                  nn.BatchNorm2d(cout)]
        return nn.Sequential(*layers, activation()) if with_act else nn.Sequential(*layers)

    class Block(nn.Module):
        def __init__(self, cin, block):
            super().__init__()
            kind, cout, stride = block[:3]
            self.se = None
            if kind == "basic":
                self.body = nn.Sequential(conv_bn(cin, cout, 3, stride),
                                          conv_bn(cout, cout, 3, with_act=False))
                self.skip = nn.Identity() if (cin, stride) == (cout, 1) else \
                    conv_bn(cin, cout, 1, stride, with_act=False)
                self.out_act = activation()
            else:
                expand, k, se = block[3:]
                mid = cin * expand
                self.body = nn.Sequential(*([conv_bn(cin, mid, 1)] if expand != 1 else []),
                                          conv_bn(mid, mid, k, stride, groups=mid))
                if se:
                    squeezed = max(1, cin // 4)
                    self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(mid, squeezed, 1),
                                            activation(), nn.Conv2d(squeezed, mid, 1),
                                            nn.Sigmoid())
                self.project = conv_bn(mid, cout, 1, with_act=False)
                self.skip = nn.Identity() if (cin, stride) == (cout, 1) else None
                self.out_act = None

        def forward(self, x):
            y = self.body(x)
            if self.se is not None:
                y = y * self.se(y)
            if hasattr(self, "project"):
                y = self.project(y)
            if self.skip is not None:
                y = y + self.skip(x)
            return self.out_act(y) if self.out_act is not None else y

    modules, channels = [conv_bn(in_channels, stem, 3, 2)], stem
    for block in blocks:
        modules.append(Block(channels, block))
        channels = block[1]
    modules += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, CLASSES)]
    return nn.Sequential(*modules).eval()


def build_keras(spec: tuple, seed: int = 0, input_hw: int = INPUT_HW, in_channels: int = 3):
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tf_keras as keras

    name, act, stem, blocks = spec
    keras.utils.set_random_seed(seed)
    layers = keras.layers

    def activation(x):
        if act == "relu6":
            return layers.ReLU(6.0)(x)
        return layers.Activation("swish" if act == "swish" else "relu")(x)

    def conv_bn(x, cout, k, stride=1, depthwise=False, with_act=True):
        if depthwise:
            x = layers.DepthwiseConv2D(k, stride, padding="same", use_bias=False)(x)
        else:
            x = layers.Conv2D(cout, k, stride, padding="same", use_bias=False)(x)
        x = layers.BatchNormalization()(x)
        return activation(x) if with_act else x

    inputs = keras.Input((input_hw, input_hw, in_channels))
    x, channels = conv_bn(inputs, stem, 3, 2), stem
    for block in blocks:
        kind, cout, stride = block[:3]
        if kind == "basic":
            y = conv_bn(conv_bn(x, cout, 3, stride), cout, 3, with_act=False)
            skip = x if (channels, stride) == (cout, 1) else \
                conv_bn(x, cout, 1, stride, with_act=False)
            x = activation(layers.Add()([y, skip]))
        else:
            expand, k, se = block[3:]
            y = conv_bn(x, channels * expand, 1) if expand != 1 else x
            y = conv_bn(y, 0, k, stride, depthwise=True)
            if se:
                s = layers.GlobalAveragePooling2D(keepdims=True)(y)
                s = activation(layers.Conv2D(max(1, channels // 4), 1)(s))
                s = layers.Conv2D(channels * expand, 1, activation="sigmoid")(s)
                y = layers.Multiply()([y, s])
            y = conv_bn(y, cout, 1, with_act=False)
            x = layers.Add()([y, x]) if (channels, stride) == (cout, 1) else y
        channels = cout
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(CLASSES)(x), name=name)

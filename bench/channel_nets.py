"""The channel-pruning case's nets, in tf_keras (NHWC) and PyTorch (NCHW), 32x32x3 input:
a ResNet-style net (BatchNorm, identity and projection shortcuts) and a MobileNetV2-style
net (inverted residuals with depthwise convs, ReLU6). Same architecture in both frameworks;
untrained (the case times them; random inputs, labels = the float model's predictions).

`bench.channel_nets:torch_resnet` / `:torch_mobilenet` are `module:function` references for
`compress ... --weights W` (channel pruning needs the nn.Module, not a .pt2).
"""
from __future__ import annotations

import os

INPUT_HW, IN_CHANNELS = 32, 3
RESNET = ((32, 1), (64, 2), (128, 2))                     # (channels, stride) per stage
MOBILENET = ((16, 1, 1), (24, 6, 2), (24, 6, 1), (32, 6, 2), (32, 6, 1), (64, 6, 2),
             (64, 6, 1))                                   # (out, expand, stride) per block
STEM, LAST = 32, 256
NET_NAMES = ("resnet", "mobilenet")


def build_keras(name: str, seed: int = 0):
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tf_keras as keras

    keras.utils.set_random_seed(seed)
    layers = keras.layers

    def conv_bn(x, filters, kernel=3, strides=1, act="relu", depthwise=False):
        conv = (layers.DepthwiseConv2D(kernel, strides, padding="same", use_bias=False)
                if depthwise else layers.Conv2D(filters, kernel, strides, padding="same",
                                                use_bias=False))
        x = layers.BatchNormalization(momentum=0.9)(conv(x))
        return {"relu": layers.ReLU(), "relu6": layers.ReLU(6.0)}.get(act, lambda t: t)(x)

    inputs = keras.Input((INPUT_HW, INPUT_HW, IN_CHANNELS))
    x = conv_bn(inputs, STEM, act="relu" if name == "resnet" else "relu6")
    if name == "resnet":
        for channels, stride in RESNET:
            shortcut = x if stride == 1 and x.shape[-1] == channels else \
                conv_bn(x, channels, 1, stride, act=None)
            y = conv_bn(conv_bn(x, channels, strides=stride), channels, act=None)
            x = layers.ReLU()(layers.Add()([shortcut, y]))
    else:
        for out, expand, stride in MOBILENET:
            y = conv_bn(x, x.shape[-1] * expand, 1, act="relu6")
            y = conv_bn(y, None, 3, stride, act="relu6", depthwise=True)
            y = conv_bn(y, out, 1, act=None)
            x = layers.Add()([x, y]) if stride == 1 and x.shape[-1] == out else y
        x = conv_bn(x, LAST, 1, act="relu6")
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(10)(x), name=name)


def build_torch(name: str, seed: int = 0):
    import torch
    from torch import nn

    torch.manual_seed(seed)

    def conv_bn(cin, cout, kernel=3, stride=1, act=nn.ReLU, groups=1):
        return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups,
                                       bias=False), nn.BatchNorm2d(cout),
                             *([act()] if act else []))

    class Block(nn.Module):
        def __init__(self, body, shortcut, after=None):
            super().__init__()
            self.body, self.shortcut, self.after = body, shortcut, after

        def forward(self, x):
            y = self.body(x)
            y = y if self.shortcut is None else y + (x if self.shortcut is True
                                                     else self.shortcut(x))
            return self.after(y) if self.after else y

    blocks, cin = [], STEM
    if name == "resnet":
        blocks.append(conv_bn(IN_CHANNELS, STEM))
        for channels, stride in RESNET:
            identity = stride == 1 and cin == channels
            blocks.append(Block(nn.Sequential(conv_bn(cin, channels, stride=stride),
                                              conv_bn(channels, channels, act=None)),
                                True if identity else conv_bn(cin, channels, 1, stride, None),
                                nn.ReLU()))
            cin = channels
    else:
        blocks.append(conv_bn(IN_CHANNELS, STEM, act=nn.ReLU6))
        for out, expand, stride in MOBILENET:
            mid = cin * expand
            body = nn.Sequential(conv_bn(cin, mid, 1, act=nn.ReLU6),
                                 conv_bn(mid, mid, 3, stride, nn.ReLU6, groups=mid),
                                 conv_bn(mid, out, 1, act=None))
            blocks.append(Block(body, True if stride == 1 and cin == out else None))
            cin = out
        blocks.append(conv_bn(cin, LAST, 1, act=nn.ReLU6))
        cin = LAST
    return nn.Sequential(*blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 10))


def torch_resnet():
    return build_torch("resnet")


def torch_mobilenet():
    return build_torch("mobilenet")

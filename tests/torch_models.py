"""Tiny PyTorch models for tests, trained inside the tests (no downloaded weights).

`torch_models:digits_cnn` is also a valid `module:function` model reference when the
tests folder is on sys.path (pytest puts it there).

It stays at the top of tests/, not in tests/support/ with the other helpers: litert-torch
writes each module's Python path into the TFLite tensor names, so a model class defined as
`support.torch_models.DigitsCNN` made every TFLite file 144-176 bytes bigger than the size
gates of the tests were set on (measured when the helpers moved).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from compressor.backends.examples import train_torch_classifier
from compressor.core.context import Data


class DigitsCNN(nn.Module):
    """A small CNN for (N, 1, 8, 8) digits with a logits head: about 39k parameters."""

    def __init__(self, filters: tuple[int, int] = (16, 32), dense: int = 64):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, filters[0], 3, padding=1), nn.ReLU(),
            nn.Conv2d(filters[0], filters[1], 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(filters[1] * 16, dense), nn.ReLU(),
                                  nn.Linear(dense, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class DigitsResidual(nn.Module):
    """Conv + BatchNorm with a skip connection and global pooling: not a plain Sequential."""

    def __init__(self, channels: int = 16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, channels, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(channels), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU())
        self.head = nn.Linear(channels, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = x + self.block(x)
        return self.head(x.mean(dim=(2, 3)))


class OutlierNet(nn.Module):
    """Digits CNN with named dense layers `hidden`, `bottleneck`, `logits` (quantize fallback)."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                                      nn.MaxPool2d(2))
        self.hidden, self.bottleneck = nn.Linear(512, 64), nn.Linear(64, 16)
        self.logits = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.hidden(torch.flatten(self.features(x), 1)))
        return self.logits(torch.relu(self.bottleneck(x)))


def _conv_bn(cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1,
             act: type[nn.Module] | None = nn.ReLU) -> nn.Sequential:
    layers = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
              nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, *([act()] if act else []))


class ResNetStyle(nn.Module):
    """A tiny ResNet (as tests/support/keras_models.resnet_style): Conv+BN stem, an identity block and
    a strided block with a 1x1 projection shortcut, global pooling, linear head."""

    def __init__(self):
        super().__init__()
        self.stem = _conv_bn(1, 24)
        self.block1 = nn.Sequential(_conv_bn(24, 24), _conv_bn(24, 24, act=None))
        self.block2 = nn.Sequential(_conv_bn(24, 48, stride=2), _conv_bn(48, 48, act=None))
        self.shortcut = _conv_bn(24, 48, 1, 2, act=None)
        self.head = nn.Linear(48, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = torch.relu(x + self.block1(x))
        x = torch.relu(self.shortcut(x) + self.block2(x))
        return self.head(x.mean(dim=(2, 3)))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, expand: int, cout: int, stride: int = 1):
        super().__init__()
        self.skip = stride == 1 and cin == cout
        self.body = nn.Sequential(_conv_bn(cin, expand, 1, act=nn.ReLU6),
                                  _conv_bn(expand, expand, 3, stride, groups=expand, act=nn.ReLU6),
                                  _conv_bn(expand, cout, 1, act=None))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.skip else self.body(x)


class MobileNetV2Style(nn.Module):
    """A tiny MobileNetV2 (as tests/support/keras_models.mobilenet_v2_style): inverted residual blocks
    with depthwise convs, BN + ReLU6 and skip adds, global pooling, linear head."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            _conv_bn(1, 16, act=nn.ReLU6), InvertedResidual(16, 48, 16),
            InvertedResidual(16, 48, 32, stride=2), InvertedResidual(32, 96, 32),
            _conv_bn(32, 96, 1, act=nn.ReLU6))
        self.head = nn.Linear(96, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


def digits_cnn(seed: int = 0) -> DigitsCNN:
    torch.manual_seed(seed)
    return DigitsCNN()


def digits_residual(seed: int = 0) -> DigitsResidual:
    torch.manual_seed(seed)
    return DigitsResidual()


def train(model: nn.Module, data: Data, epochs: int = 8, lr: float = 3e-3,
          seed: int = 0) -> nn.Module:
    """Plain Adam + cross-entropy training, in place; returns the model in eval mode."""
    return train_torch_classifier(model, *data.train, epochs=epochs, lr=lr, seed=seed)


def accuracy(outputs: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(np.argmax(outputs, axis=-1) == labels))

"""Pretrained PyTorch nets for the fine-tuning acceptance test (issue 15): each is trained
from scratch in the test, to high digits accuracy, before it is compressed.

`ResNet10` (basic blocks: Conv+BN, skip Adds, strided projections) and `MobileNetV2Small`
(inverted residuals: depthwise convs, BN, ReLU6) are wide enough that their weights are
small (fan-in up to 1152): a from-scratch rate moves them far, which the tiny nets of
tests/torch_models shrug off. `DigitsTransformer` reads the 8x8 image as 8 tokens of 8
pixels (one pre-norm encoder block, LayerNorm, attention written with Linear layers so that
int8 quantizes its projections). `train` is an ordinary from-scratch loop: Adam with the
rate decayed to 0 along a cosine, batches of 32.
"""
from __future__ import annotations


import torch
from torch import nn

from compressor.backends.examples import train_torch_classifier
from compressor.core.context import Data

import torch_models as tm


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 Conv+BN, a skip Add (a strided 1x1 Conv+BN projection
    when the shape changes), ReLU after the Add."""

    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.body = nn.Sequential(tm._conv_bn(cin, cout, stride=stride),
                                  tm._conv_bn(cout, cout, act=None))
        self.shortcut = (nn.Identity() if stride == 1 and cin == cout
                         else tm._conv_bn(cin, cout, 1, stride, act=None))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.shortcut(x) + self.body(x))


class ResNet10(nn.Module):
    """A ResNet-18 layout cut to 4 basic blocks for 8x8 inputs: widths 32 / 64 / 128 / 128
    (~0.8M parameters, 10 conv layers with BatchNorm)."""

    def __init__(self, widths: tuple[int, ...] = (32, 64, 128, 128)):
        super().__init__()
        self.stem = tm._conv_bn(1, widths[0])
        blocks, cin = [], widths[0]
        for index, width in enumerate(widths):
            blocks.append(BasicBlock(cin, width, stride=2 if 0 < index < 3 else 1))
            cin = width
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))


class MobileNetV2Small(nn.Module):
    """MobileNetV2's layout for 8x8 inputs: Conv+BN+ReLU6 stem, six inverted residual blocks
    (1x1 expand, 3x3 depthwise, 1x1 project, BatchNorm after each, skip Adds where shapes
    match), a 1x1 Conv+BN head, global pooling, linear classifier."""

    def __init__(self):
        super().__init__()
        settings = [(16, 1, 16, 1), (16, 6, 24, 2), (24, 6, 24, 1), (24, 6, 48, 2),
                    (48, 6, 48, 1), (48, 6, 64, 1)]   # (in, expansion, out, stride)
        self.features = nn.Sequential(
            tm._conv_bn(1, 16, act=nn.ReLU6),
            *(tm.InvertedResidual(cin, cin * t, cout, stride) for cin, t, cout, stride in settings),
            tm._conv_bn(64, 256, 1, act=nn.ReLU6))
        self.head = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


class EncoderBlock(nn.Module):
    def __init__(self, width: int, heads: int, hidden: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, tokens, 3, self.heads, -1).permute(
            2, 0, 3, 1, 4)
        weights = torch.softmax(q @ k.transpose(-2, -1) / (q.shape[-1] ** 0.5), dim=-1)
        attended = (weights @ v).transpose(1, 2).reshape(batch, tokens, width)
        x = x + self.proj(attended)
        return x + self.mlp(self.norm2(x))


class DigitsTransformer(nn.Module):
    """(N, 1, 8, 8) digits as 8 row tokens: linear embedding + learned positions, one encoder
    block, mean pooling, linear head."""

    def __init__(self, width: int = 32, heads: int = 4, hidden: int = 64):
        super().__init__()
        self.embed = nn.Linear(8, width)
        self.position = nn.Parameter(torch.randn(1, 8, width) * 0.02)
        self.block = EncoderBlock(width, heads, hidden)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x[:, 0]) + self.position
        return self.head(self.norm(self.block(x)).mean(dim=1))


BUILDERS = {"resnet10": ResNet10, "mobilenet_v2": MobileNetV2Small,
            "transformer": DigitsTransformer}


def build(net: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return BUILDERS[net]()


def train(model: nn.Module, data: Data, epochs: int, lr: float, seed: int = 0) -> nn.Module:
    """Adam + cross-entropy from scratch, the rate cosine-decayed to 0; in place, eval mode."""
    return train_torch_classifier(model, *data.train, epochs=epochs, lr=lr, seed=seed,
                                  cosine=True)

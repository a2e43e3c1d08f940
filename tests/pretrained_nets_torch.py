"""Pretrained PyTorch nets for the fine-tuning acceptance test (issue 15): each is trained
from scratch in the test, to high digits accuracy, before it is compressed.

The ResNet-style and MobileNetV2-style nets are tests/torch_models' (BatchNorm after every
conv, skip Adds; depthwise convs and inverted residuals); `DigitsTransformer` reads the 8x8
image as 8 tokens of 8 pixels (one pre-norm encoder block, LayerNorm, attention written
with Linear layers so that int8 quantizes its projections).
"""
from __future__ import annotations

import torch
from torch import nn

import torch_models as tm


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


BUILDERS = {"resnet_style": tm.ResNetStyle, "mobilenet_v2_style": tm.MobileNetV2Style,
            "transformer": DigitsTransformer}


def build(net: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return BUILDERS[net]()

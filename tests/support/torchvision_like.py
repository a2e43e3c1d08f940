"""torchvision's ShuffleNetV2 and VisionTransformer, rebuilt small (torchvision is not a test
dependency): the same module structure, reshapes and parameters as torchvision.models, sized
for (N, 1, 8, 8) digits. Random init; nothing is downloaded."""
from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn


def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    """torchvision.models.shufflenetv2.channel_shuffle: view (N, g, C/g, H, W), transpose, flatten."""
    batchsize, num_channels, height, width = x.size()
    x = x.view(batchsize, groups, num_channels // groups, height, width)
    x = torch.transpose(x, 1, 2).contiguous()
    return x.view(batchsize, num_channels, height, width)


def _depthwise(channels: int, stride: int) -> nn.Conv2d:
    return nn.Conv2d(channels, channels, 3, stride, 1, bias=False, groups=channels)


class InvertedResidual(nn.Module):
    """torchvision's ShuffleNetV2 unit: split (stride 1) or two branches (stride 2), concat,
    channel shuffle."""

    def __init__(self, inp: int, oup: int, stride: int):
        super().__init__()
        self.stride = stride
        branch = oup // 2
        if stride > 1:
            self.branch1 = nn.Sequential(_depthwise(inp, stride), nn.BatchNorm2d(inp),
                                         nn.Conv2d(inp, branch, 1, bias=False),
                                         nn.BatchNorm2d(branch), nn.ReLU(inplace=True))
        else:
            self.branch1 = nn.Sequential()
        self.branch2 = nn.Sequential(
            nn.Conv2d(inp if stride > 1 else branch, branch, 1, bias=False),
            nn.BatchNorm2d(branch), nn.ReLU(inplace=True), _depthwise(branch, stride),
            nn.BatchNorm2d(branch), nn.Conv2d(branch, branch, 1, bias=False),
            nn.BatchNorm2d(branch), nn.ReLU(inplace=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), dim=1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
        return channel_shuffle(out, 2)


class ShuffleNetV2(nn.Module):
    """conv1 -> stage2 -> stage3 -> conv5 -> mean -> fc, as torchvision's (no max pool)."""

    def __init__(self, repeats: tuple[int, ...] = (2, 2),
                 widths: tuple[int, ...] = (16, 32, 64, 128), classes: int = 10):
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv2d(1, widths[0], 3, 1, 1, bias=False),
                                   nn.BatchNorm2d(widths[0]), nn.ReLU(inplace=True))
        width = widths[0]
        for index, (count, out) in enumerate(zip(repeats, widths[1:-1])):
            units = [InvertedResidual(width, out, 2)] + \
                [InvertedResidual(out, out, 1) for _ in range(count - 1)]
            setattr(self, f"stage{index + 2}", nn.Sequential(*units))
            width = out
        self.stages = len(repeats)
        self.conv5 = nn.Sequential(nn.Conv2d(width, widths[-1], 1, bias=False),
                                   nn.BatchNorm2d(widths[-1]), nn.ReLU(inplace=True))
        self.fc = nn.Linear(widths[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        for index in range(self.stages):
            x = getattr(self, f"stage{index + 2}")(x)
        return self.fc(self.conv5(x).mean([2, 3]))


class MLPBlock(nn.Sequential):
    def __init__(self, width: int, hidden: int):
        super().__init__(nn.Linear(width, hidden), nn.GELU(), nn.Dropout(0.0),
                         nn.Linear(hidden, width), nn.Dropout(0.0))


class EncoderBlock(nn.Module):
    def __init__(self, heads: int, width: int, hidden: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.dropout = nn.Dropout(0.0)
        self.ln_2 = nn.LayerNorm(width, eps=1e-6)
        self.mlp = MLPBlock(width, hidden)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        x = self.ln_1(inputs)
        x, _ = self.self_attention(x, x, x, need_weights=False)
        x = self.dropout(x) + inputs
        return x + self.mlp(self.ln_2(x))


class Encoder(nn.Module):
    """Holds the position embedding as its own nn.Parameter, as torchvision's does."""

    def __init__(self, length: int, layers: int, heads: int, width: int, hidden: int):
        super().__init__()
        self.pos_embedding = nn.Parameter(torch.empty(1, length, width).normal_(std=0.02))
        self.dropout = nn.Dropout(0.0)
        self.layers = nn.Sequential(OrderedDict(
            (f"encoder_layer_{i}", EncoderBlock(heads, width, hidden)) for i in range(layers)))
        self.ln = nn.LayerNorm(width, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(self.layers(self.dropout(x + self.pos_embedding)))


class VisionTransformer(nn.Module):
    """Patch conv, a class token (an nn.Parameter of the model itself), the encoder, a head."""

    def __init__(self, image: int = 8, patch: int = 2, layers: int = 2, heads: int = 4,
                 width: int = 32, hidden: int = 64, classes: int = 10, channels: int = 1):
        super().__init__()
        self.patch, self.width = patch, width
        self.conv_proj = nn.Conv2d(channels, width, patch, patch)
        self.class_token = nn.Parameter(torch.zeros(1, 1, width))
        self.encoder = Encoder((image // patch) ** 2 + 1, layers, heads, width, hidden)
        self.heads = nn.Sequential(OrderedDict(head=nn.Linear(width, classes)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        x = self.conv_proj(x).reshape(n, self.width, (h // self.patch) * (w // self.patch))
        x = x.permute(0, 2, 1)
        x = torch.cat([self.class_token.expand(n, -1, -1), x], dim=1)
        return self.heads(self.encoder(x)[:, 0])

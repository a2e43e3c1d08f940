"""PyTorch `structure: channel` on torchvision-style blocks (issue 27): ShuffleNetV2's channel
shuffle (torch-pruning divided by zero on its reshape: exit 1) and a ViT whose class token
and position embedding are bare nn.Parameters (nothing was removed, `kept_whole` named ''),
and a prune step that removes under half of what it was asked is refused, naming why.
One-shot (epochs 0): seconds each."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch import nn

from compressor.backends import get_backend
from compressor.backends.torch.channel_groups import (RESHAPE_REASON, keeps_channel_order,
                                                      splits_channels)
from compressor.core.context import ModelState
from compressor.tasks.array.data import digits
from compressor.errors import BackendUnavailableError
from compressor.config.steps import PruneConfig

from support import helpers
from support.torchvision_like import ShuffleNetV2, VisionTransformer


@pytest.fixture(scope="module")
def data():
    return digits("NCHW")


def _pruned(model, data, tmp_path):
    ctx = helpers.context(data, tmp_path)
    state = helpers.apply(get_backend("torch"), ModelState(model),
                          PruneConfig(sparsity=0.5, structure="channel", epochs=0), ctx)
    (section,) = ctx.record.sections
    return state.model, section.report({})


def _pruned_with_the_same_outputs(model, data, tmp_path):
    """Prune the dead channels; the outputs on 16 samples must not change."""
    x = torch.as_tensor(data.val[0][:16])
    with torch.no_grad():
        before = model(x).numpy()
    pruned, report = _pruned(model, data, tmp_path)
    with torch.no_grad():
        np.testing.assert_allclose(pruned(x).numpy(), before, atol=1e-5)
    return pruned, report


def _kill_upper_half(*slices):
    """Zero the upper half of each (parameter, axis): a channel group's dead channels."""
    with torch.no_grad():
        for parameter, axis in slices:
            half = parameter.shape[axis] // 2
            parameter.narrow(axis, half, parameter.shape[axis] - half).zero_()


def _dead_shufflenet() -> ShuffleNetV2:
    """repeats (3,): torch-pruning 1.6.1 divided by zero on its shuffle reshape. The upper half
    of every group that may be cut is dead: the stem's channels, each unit's branch2 middle
    channels, conv5's; the channels that pass a shuffle are all alive."""
    torch.manual_seed(0)
    model = ShuffleNetV2(repeats=(3,), widths=(16, 32, 64)).eval()
    first = model.stage2[0]
    _kill_upper_half((model.conv1[0].weight, 0), (model.conv1[1].weight, 0),
                     (first.branch1[0].weight, 0), (first.branch1[2].weight, 1),
                     (first.branch2[0].weight, 1), (model.conv5[0].weight, 0),
                     (model.conv5[1].weight, 0), (model.fc.weight, 1))
    for unit in model.stage2:
        middle = unit.branch2
        _kill_upper_half((middle[0].weight, 0), (middle[1].weight, 0), (middle[3].weight, 0),
                         (middle[4].weight, 0), (middle[5].weight, 1))
    return model


def test_shufflenet_prunes_around_its_channel_shuffles_exactly(data, tmp_path):
    """Only channels that no shuffle reorders go, and the outputs do not change; every group
    that passes a shuffle (or the chunk that splits it) is kept whole and says so."""
    pruned, report = _pruned_with_the_same_outputs(_dead_shufflenet(), data, tmp_path)
    assert pruned.conv1[0].out_channels == 8 and pruned.conv5[0].out_channels == 32
    assert [unit.branch2[0].out_channels for unit in pruned.stage2] == [8, 8, 8]
    assert [unit.branch2[5].out_channels for unit in pruned.stage2] == [16, 16, 16]
    reasons = {layer: entry["reason"] for entry in report["kept_whole"]
               for layer in entry["layers"]}
    assert reasons == {"fc": "a model output (e.g. the classifier head)",
                       **{f"stage2.{i}.branch2.5": RESHAPE_REASON for i in range(3)},
                       "stage2.0.branch1.2": RESHAPE_REASON}, reasons
    # measured: 5,722 -> 2,866 parameters, 92,800 -> 42,304 MACs
    assert (report["model_before"]["params"], report["model_after"]["params"]) == (5_722, 2_866)


def test_vit_mlp_hidden_units_go_and_kept_whole_names_real_modules(data, tmp_path):
    """torchvision's VisionTransformer: the class token (the model's own nn.Parameter) used to
    mark the whole model as an output maker (kept_whole [''], nothing removed). Each MLP's
    hidden units (fc1 outputs / fc2 inputs) are a free group and go; the residual stream
    reaches the position embedding and stays, saying so."""
    torch.manual_seed(0)
    model = VisionTransformer().eval()
    for layer in model.encoder.layers:
        _kill_upper_half((layer.mlp[0].weight, 0), (layer.mlp[0].bias, 0),
                         (layer.mlp[3].weight, 1))
    pruned, report = _pruned_with_the_same_outputs(model, data, tmp_path)
    assert [layer.mlp[0].out_features for layer in pruned.encoder.layers] == [32, 32]
    layers = [name for entry in report["kept_whole"] for name in entry["layers"]]
    assert "" not in layers and all(pruned.get_submodule(name) is not None for name in layers)
    assert sorted(layers) == ["conv_proj", "encoder.layers.encoder_layer_0.mlp.3",
                              "encoder.layers.encoder_layer_1.mlp.3", "heads.head"]
    assert "nn.Parameter encoder.pos_embedding of Encoder" in report["kept_whole"][1]["reason"]
    # measured: 18,218 -> 14,058 parameters, 141,632 -> 72,000 MACs
    assert report["model_before"]["params"] == 18_218
    assert report["model_after"]["params"] == 18_218 - 2 * (32 * 32 + 32 + 32 * 32)


class ChannelScale(nn.Module):
    """A custom layer: a per-channel weight torch-pruning does not know how to slice."""

    def __init__(self, channels: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(channels))

    def forward(self, x):
        return x * self.scale.view(1, -1, 1, 1)


def test_a_step_that_removes_under_half_of_its_channels_is_refused(data, tmp_path):
    """Both conv groups reach a custom layer: nothing can go. The step is refused before any
    fine-tuning, naming the layers and why (it used to pass, removing nothing)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), ChannelScale(16), nn.ReLU(),
                          nn.Conv2d(16, 32, 3, padding=1), ChannelScale(32), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).eval()
    message = ("channel pruning removed 0% of the 24 channels asked for (50% of 2 channel "
               "groups; at least 50% is required): 3, 0 kept whole: its channels reach custom "
               "layer 4 (ChannelScale), which cannot be sliced safely; use structure: "
               "unstructured")
    with pytest.raises(BackendUnavailableError, match=re.escape(message)):
        _pruned(model, data, tmp_path)


def test_which_reshapes_and_splits_keep_the_channel_order():
    assert keeps_channel_order((2, 16, 4, 4), (2, 16, 16))        # spatial flatten (ViT patches)
    assert keeps_channel_order((2, 16, 4, 4), (2, 256))           # flatten before a Linear
    assert keeps_channel_order((2, 5, 32), (2, 5, 4, 8))          # heads (channels last)
    assert not keeps_channel_order((2, 16, 4, 4), (2, 2, 8, 4, 4))   # channel shuffle, in
    assert not keeps_channel_order((2, 8, 2, 4, 4), (2, 16, 4, 4))   # and out
    assert splits_channels((2, 16, 4, 4), 1)                       # x.chunk(2, dim=1)
    assert splits_channels((2, 5, 96), 2 ** 64 - 1)                # qkv.chunk(3, dim=-1)
    assert not splits_channels((2, 16, 4, 4), 3)

"""compressor/backends/channel_plan.py: how many channels a group keeps, which ones, their
importance, the target_macs search and the report section. numpy only, no framework."""
from __future__ import annotations

import numpy as np
import pytest

from compressor.backends.channel_plan import (MAX_RATIO, ChannelPruning, aligned_count,
                                              channel_ratio, kept_channels, kept_count,
                                              l2_importance)
from compressor.config.steps import PruneConfig


@pytest.mark.parametrize("count, ratio, multiple, kept", [
    (10, 0.3, 1, 7),
    (10, 0.0, 1, 10),
    (10, 0.95, 1, 1),      # never below one channel
    (3, 0.5, 1, 1),        # round(1.5) = 2 removed
    (5, 0.5, 1, 3),        # round(2.5) = 2 removed: halves round to even
    (64, 0.3, 16, 48),     # 64 - 19 = 45 -> the nearest multiple of 16
    (64, 0.5, 16, 32),
    (64, 0.9, 16, 16),     # 6 kept -> never below the multiple
    (8, 0.5, 16, 4),       # a group no wider than the multiple keeps its own count
])
def test_kept_count(count, ratio, multiple, kept):
    assert kept_count(count, ratio, multiple) == kept


@pytest.mark.parametrize("keep, count, multiple, aligned", [
    (24, 64, 16, 32),   # 1.5 multiples: halves go to the even multiple (2)
    (40, 64, 16, 32),   # 2.5 multiples -> 2
    (56, 64, 16, 64),   # 3.5 -> 4
    (8, 64, 16, 16),    # rounds to 0 multiples -> never below one multiple
    (56, 56, 16, 56),   # 3.5 -> 4 x 16 = 64, capped at the group's width
    (5, 64, 1, 5),      # multiple 1: unchanged
    (5, 12, 16, 5),     # group narrower than the multiple: unchanged
])
def test_aligned_count(keep, count, multiple, aligned):
    assert aligned_count(keep, count, multiple) == aligned


def test_kept_channels_are_the_most_important_in_index_order():
    importance = np.array([0.1, 5.0, 3.0, 0.2, 4.0])
    assert kept_channels(importance, 0.4).tolist() == [1, 2, 4]   # 5 - round(2.0) = 3 kept
    assert kept_channels(importance, 0.0).tolist() == [0, 1, 2, 3, 4]


def test_kept_channels_break_ties_by_position():
    assert kept_channels(np.ones(4), 0.5).tolist() == [0, 1]


def test_kept_channels_honour_the_multiple():
    importance = np.arange(32, dtype=float)          # the last channels matter most
    kept = kept_channels(importance, 0.3, multiple=8)  # 32 - 10 = 22 -> 24
    assert kept.tolist() == list(range(8, 32))


def test_l2_importance_normalises_each_layer_by_its_mean():
    dense = np.array([[3.0, 0.0, 0.0],
                      [4.0, 0.0, 1.0]])          # column norms 5, 0, 1 (mean 2)
    conv = np.ones((2, 2, 1, 3))                 # every filter's norm 2 (mean 2)
    np.testing.assert_allclose(l2_importance([dense]), [2.5, 0.0, 0.5])
    np.testing.assert_allclose(l2_importance([dense, conv]), [3.5, 1.0, 1.5])
    # a layer 100x larger weighs the same as before: only relative norms count
    np.testing.assert_allclose(l2_importance([dense * 100.0, conv]), [3.5, 1.0, 1.5])


def test_l2_importance_of_an_all_zero_layer_is_zero():
    np.testing.assert_allclose(l2_importance([np.zeros((4, 3))]), [0.0, 0.0, 0.0])


def test_channel_ratio_is_the_sparsity_without_target_macs():
    config = PruneConfig(sparsity=0.3, structure="channel")
    assert channel_ratio(config, lambda ratio: pytest.fail("no MAC count needed")) == 0.3


def test_channel_ratio_finds_the_smallest_ratio_under_the_mac_budget():
    config = PruneConfig(structure="channel", target_macs=0.5)

    def macs_at(ratio: float) -> int:   # a conv stack: both sides of each layer shrink
        return int(1_000_000 * (1 - ratio) ** 2)

    ratio = channel_ratio(config, macs_at)
    exact = 1 - np.sqrt(0.5)                     # 0.2929: (1 - r)^2 = 0.5
    assert macs_at(ratio) <= 500_000
    assert exact <= ratio <= exact + MAX_RATIO / 2 ** 7   # bisection to 1/128 of the range


def test_channel_ratio_stops_at_max_ratio_when_no_ratio_fits():
    config = PruneConfig(structure="channel", target_macs=0.001)
    assert channel_ratio(config, lambda ratio: int(1000 * (1 - ratio))) == MAX_RATIO == 0.9


def test_channel_pruning_report_section():
    section = ChannelPruning(ratio=0.296875, model_before={"params": 1000, "macs": 50_000},
                             model_after={"params": 500, "macs": 24_000}, groups_pruned=3,
                             kept_whole=({"layers": ["head"], "reason": "the model's output"},),
                             attention_heads=({"layer": "mha", "before": 4, "after": 3},),
                             widths=({"layer": "conv", "before": 16, "after": 11},),
                             target_macs=0.5)
    assert section.key == "channel_pruning"
    assert section.report({}) == {
        "structure": "channel", "ratio": 0.2969, "target_macs": 0.5,
        "model_before": {"params": 1000, "macs": 50_000},
        "model_after": {"params": 500, "macs": 24_000}, "groups_pruned": 3,
        "attention_heads": [{"layer": "mha", "before": 4, "after": 3}],
        "widths": [{"layer": "conv", "before": 16, "after": 11}],
        "kept_whole": [{"layers": ["head"], "reason": "the model's output"}]}

"""What both backends' channel pruning share: how many channels a group keeps, the MAC
budget search of `target_macs`, and the report section (report.json `channel_pruning`).

Framework-neutral: the backends pass in their own counting and pruning functions.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from compressor.errors import BackendUnavailableError
from compressor.config.steps import PruneConfig

MAX_RATIO = 0.9           # target_macs never removes more than this fraction of a group
BUDGET_SEARCH_STEPS = 7   # bisection steps of the ratio search (1/128 resolution)
MIN_REMOVED = 0.5         # of the channels asked for: below it the prune step is refused


def kept_count(count: int, ratio: float, multiple: int = 1) -> int:
    """How many of a group's `count` channels stay: round((1 - ratio) x count), >= 1, then
    aligned to `multiple` (aligned_count)."""
    return aligned_count(max(1, count - int(round(ratio * count))), count, multiple)


def aligned_count(keep: int, count: int, multiple: int) -> int:
    """`keep` rounded to the nearest multiple of `multiple` (halves to the even multiple, so
    over many groups as many round up as down), never below `multiple` nor above `count`;
    groups no wider than `multiple` keep `keep`. SIMD kernels (int8 ones above all) work on
    16 or 8 channels at a time, and a remainder runs far slower per channel."""
    if multiple <= 1 or count <= multiple:
        return keep
    return min(count, max(multiple, round(keep / multiple) * multiple))


def kept_channels(importance: np.ndarray, ratio: float, multiple: int = 1) -> np.ndarray:
    """Sorted indices of the channels to keep: the kept_count most important."""
    keep = kept_count(len(importance), ratio, multiple)
    return np.sort(np.argsort(-np.asarray(importance), kind="stable")[:keep])


def l2_importance(kernels: list[np.ndarray]) -> np.ndarray:
    """Per output channel (last axis): the L2 norm of its weights, each layer's norms divided
    by their mean so that every layer feeding the group weighs the same, summed."""
    total = 0.0
    for kernel in kernels:
        norms = np.sqrt(np.sum(np.square(kernel.reshape(-1, kernel.shape[-1])), axis=0))
        total = total + norms / max(float(np.mean(norms)), 1e-12)
    return np.asarray(total)


def channel_ratio(config: PruneConfig, macs_at: Callable[[float], int]) -> float:
    """config.sparsity, or with `target_macs` the smallest ratio (to 1/128) whose pruned model
    has at most target_macs x the MACs of the unpruned one (MAX_RATIO if none does)."""
    if config.target_macs is None:
        return float(config.sparsity)
    budget = config.target_macs * macs_at(0.0)
    low, high = 0.0, MAX_RATIO
    if macs_at(high) > budget:
        return high
    for _ in range(BUDGET_SEARCH_STEPS):
        middle = (low + high) / 2
        low, high = (low, middle) if macs_at(middle) <= budget else (middle, high)
    return high


def require_removed(before: Mapping[str, int], after: Mapping[str, int], ratio: float,
                    blocked: list[tuple[str, str]]) -> None:
    """Refuse (BackendUnavailableError) a step that removed under MIN_REMOVED of the channels
    it was asked to: `ratio` of every group's width (`before`, per group root layer; groups
    making a model output are not asked), against the widths `after` pruning; `blocked`: the
    (layer, reason) left whole, named in the message. A silent no-op must not pass as done."""
    asked = ratio * sum(before.values())
    removed = sum(width - after[name] for name, width in before.items())
    if asked <= 0 or removed >= MIN_REMOVED * asked:
        return
    if blocked:
        names = ", ".join(name for name, _ in blocked[:3]) + \
            (f" and {len(blocked) - 3} more" if len(blocked) > 3 else "")
        why = f"{names} kept whole: {blocked[0][1]}"
    else:   # channel_multiple rounding on narrow groups
        why = "the groups are too narrow for this ratio and channel_multiple"
    raise BackendUnavailableError(
        f"channel pruning removed {removed / asked:.0%} of the {asked:.0f} channels asked for "
        f"({ratio:.0%} of {len(before)} channel groups; at least {MIN_REMOVED:.0%} is required): "
        f"{why}; use structure: unstructured")


@dataclass(frozen=True)
class ChannelPruning:
    """report.json `channel_pruning`: the applied ratio, the framework model's params / MACs
    before and after (each artifact's own, read back from its file, are in its row), the
    attention layers whose heads were removed ({"layer", "before", "after"} head counts), the
    output widths of the layers that make each pruned group ({"layer", "before", "after"}),
    and the layers left whole with the reason."""

    ratio: float
    model_before: dict[str, int]
    model_after: dict[str, int]
    groups_pruned: int
    kept_whole: tuple[dict[str, Any], ...] = ()
    attention_heads: tuple[dict[str, Any], ...] = ()
    widths: tuple[dict[str, Any], ...] = ()
    target_macs: float | None = None
    key: str = field(default="channel_pruning", init=False)

    def report(self, artifacts: Mapping[str, Path]) -> dict[str, Any]:
        return {"structure": "channel", "ratio": round(self.ratio, 4),
                "target_macs": self.target_macs, "model_before": self.model_before,
                "model_after": self.model_after, "groups_pruned": self.groups_pruned,
                "attention_heads": list(self.attention_heads), "widths": list(self.widths),
                "kept_whole": list(self.kept_whole)}

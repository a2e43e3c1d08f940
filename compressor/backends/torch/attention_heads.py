"""Whole attention heads for channel pruning: which Linear layers project one attention
module's queries, keys and values, and its head count once torch-pruning has cut them.

Hugging Face style attention (BertSelfAttention, ViT, ...) keeps q / k / v as separate Linear
children and splits their outputs by a head size; told each projection's head count,
torch-pruning removes whole heads from all three (and the output projection's matching input
columns), ranked by the mean importance of a head's channels. The head size stays, so the
module's reshapes still hold; its head-count attributes are updated afterwards.
nn.MultiheadAttention packs q / k / v into one weight as wide as the model: its heads cannot go
without narrowing the model, so torch-pruning narrows every head instead when the model width's
group is free.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from compressor.backends.channel_plan import kept_count

HEAD_COUNTS = ("num_attention_heads", "num_heads", "n_heads")
PROJECTIONS = (("query", "key", "value"), ("q_proj", "k_proj", "v_proj"), ("q", "k", "v"))
# torch-pruning removes ceil(ratio x heads) heads: a ratio just under removed / heads removes
# exactly `removed`.
JUST_UNDER = 1e-6


@dataclass(frozen=True)
class HeadSplit:
    """One attention module that splits its q / k / v projections into heads."""

    name: str
    module: torch.nn.Module
    count_attribute: str
    projections: tuple[torch.nn.Linear, ...]
    heads: int
    head_size: int   # before pruning (the projections' widths change, the head size does not)

    def head_ratio(self, ratio: float) -> float:
        """torch-pruning's head ratio that removes the heads channel_plan.kept_count drops at
        channel ratio `ratio` (as many as Keras removes; at least one head stays)."""
        removed = self.heads - kept_count(self.heads, ratio)
        return removed / self.heads - JUST_UNDER if removed else 0.0

    def settle(self) -> dict[str, Any]:
        """After pruning: the module's head counts to match its projections; the report entry."""
        heads = self.projections[0].out_features // self.head_size
        setattr(self.module, self.count_attribute, heads)
        if isinstance(getattr(self.module, "all_head_size", None), int):
            self.module.all_head_size = heads * self.head_size
        return {"layer": self.name, "before": self.heads, "after": heads}


def head_splits(model: torch.nn.Module) -> Iterator[HeadSplit]:
    """The model's attention modules with a head count and equally wide q / k / v Linear
    children (grouped-query attention, whose k / v are narrower, is not head-pruned)."""
    for name, module in model.named_modules():
        count = next((attr for attr in HEAD_COUNTS
                      if type(getattr(module, attr, None)) is int), None)
        if count is None or isinstance(module, torch.nn.MultiheadAttention):
            continue
        heads = getattr(module, count)
        for names in PROJECTIONS:
            linears = tuple(getattr(module, child, None) for child in names)
            if all(isinstance(linear, torch.nn.Linear) for linear in linears):
                break
        else:
            continue
        widths = {linear.out_features for linear in linears}
        if heads > 1 and len(widths) == 1 and widths.pop() % heads == 0:
            yield HeadSplit(name, module, count, linears, heads, linears[0].out_features // heads)


def pruner_options(splits: list[HeadSplit], ratio: float) -> dict[str, Any]:
    """torch-pruning MagnitudePruner keywords that remove whole heads of `splits`."""
    if not splits:
        return {}
    return {"num_heads": {linear: split.heads for split in splits for linear in split.projections},
            "prune_num_heads": True, "prune_head_dims": False,
            "head_pruning_ratio_dict": {linear: split.head_ratio(ratio) for split in splits
                                        for linear in split.projections}}

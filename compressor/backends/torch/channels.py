"""Channel pruning of nn.Modules with torch-pruning (DepGraph): a smaller dense model.

torch-pruning traces the module once and groups every coupled channel set (residual adds,
concatenations, depthwise convs, BatchNorm); each group keeps its channels of largest L2
norm. Groups making a model output, reaching a custom layer or a bare nn.Parameter, or
passing a split or a channel-mixing reshape stay whole (channel_groups.py); a step that so
removes under half of the channels it was asked to is refused before fine-tuning, naming why.
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import torch

from compressor.backends.channel_plan import (ChannelPruning, aligned_count, channel_ratio,
                                              require_removed)
from compressor.backends.torch.attention_heads import head_splits, pruner_options
from compressor.backends.torch.channel_groups import (KERNELS, OUTPUT_REASON, mappings_checked,
                                                      out_channels, plan_groups)
from compressor.backends.torch.env import require
from compressor.backends.torch.infer import example_input
from compressor.backends.torch.io import as_tensors
from compressor.backends.torch.load import clone_module
from compressor.backends.torch.train import fine_tune, is_exported
from compressor.errors import BackendUnavailableError, first_line
from compressor.config.steps import DistillConfig

if TYPE_CHECKING:
    from compressor.core.context import Context, ModelState
    from compressor.config.steps import PruneConfig

EXAMPLE_ROWS = 2
PRUNE_ERRORS = (RuntimeError, ValueError, TypeError, KeyError, IndexError, ArithmeticError)


def channel_pruned(state: ModelState, config: PruneConfig, ctx: Context) -> ModelState:
    """The state with a copy of the model whose free channel groups lost `ratio` of their
    channels, fine-tuned for `config.epochs`, and the `channel_pruning` report section."""
    if is_exported(state.model):
        raise BackendUnavailableError(
            "channel pruning needs the nn.Module, not an exported .pt2 graph; pass the model as "
            "module:function (with --weights) or as an nn.Module in Python")
    original = state.model
    # forward()'s positional inputs (one per named input), as torch-pruning traces them.
    example = tuple(as_tensors(original, example_input(ctx, EXAMPLE_ROWS)))
    plan = _traced(lambda tp: plan_groups(tp, original, example), original)
    kept_whole = plan.kept_whole

    groups, heads = [0], [()]

    def pruned_at(ratio: float) -> torch.nn.Module:
        working = clone_module(original)
        if ratio > 0:
            groups[0], heads[0] = _prune(working, example, ratio,
                                         [_module(working, name) for name, _ in kept_whole],
                                         config.channel_multiple)
        return working

    ratio = channel_ratio(config, lambda r: torch_macs(pruned_at(r), example))
    pruned = pruned_at(ratio)
    require_removed(plan.widths, {name: out_channels(pruned.get_submodule(name))
                                  for name in plan.widths}, ratio,
                    [(name, why) for name, why in kept_whole if why != OUTPUT_REASON])
    if config.epochs > 0:
        fine_tune(pruned, config, ctx, f"channel pruning {ratio:.0%}, fine-tuning", None,
                  state.last(DistillConfig))
    section = ChannelPruning(
        ratio=ratio, target_macs=config.target_macs, groups_pruned=groups[0],
        model_before={"params": _params(original), "macs": torch_macs(original, example)},
        model_after={"params": _params(pruned), "macs": torch_macs(pruned, example)},
        attention_heads=heads[0],
        widths=tuple({"layer": name, "before": width,
                      "after": out_channels(pruned.get_submodule(name))}
                     for name, width in plan.widths.items()),
        kept_whole=tuple({"layers": [name], "reason": reason} for name, reason in kept_whole))
    ctx.record.add_section(section)
    return state.replace(model=pruned.eval())


def _traced(analyse: Any, model: torch.nn.Module) -> Any:
    """`analyse(torch_pruning)`, a failure of torch-pruning's trace as a typed error."""
    tp = _torch_pruning()
    try:
        return analyse(tp)
    except PRUNE_ERRORS as exc:
        raise BackendUnavailableError(f"torch-pruning cannot trace {type(model).__name__}'s "
                                      f"channel groups ({type(exc).__name__}: {first_line(exc)}); "
                                      "use structure: unstructured") from None


def _prune(model: torch.nn.Module, example: tuple[torch.Tensor, ...], ratio: float,
           ignored: list[torch.nn.Module], multiple: int) -> tuple[int, tuple[dict[str, Any], ...]]:
    """Prune `model` in place; the number of channel groups it pruned and, per attention
    module that lost whole heads, its head counts."""
    tp = _torch_pruning()
    splits = list(head_splits(model))
    try:
        # (grouping and pruning re-run the index mapping: all inside mappings_checked)
        with warnings.catch_warnings(), mappings_checked(tp):
            warnings.simplefilter("ignore", UserWarning)   # the groups they touch are ignored
            pruner = _aligned_pruner(tp)(model.eval(), example,
                                         importance=tp.importance.MagnitudeImportance(p=2),
                                         pruning_ratio=ratio, ignored_layers=ignored,
                                         round_to=multiple if multiple > 1 else None,
                                         **pruner_options(splits, ratio))
            groups = sum(1 for _ in pruner.DG.get_all_groups(
                ignored_layers=pruner.ignored_layers, root_module_types=pruner.root_module_types))
            pruner.step()
        return groups, tuple(split.settle() for split in splits)
    except PRUNE_ERRORS as exc:
        raise BackendUnavailableError(f"torch-pruning cannot prune {type(model).__name__} by "
                                      f"channels ({type(exc).__name__}: {first_line(exc)}); use "
                                      "structure: unstructured") from None


def _aligned_pruner(tp: Any) -> type:
    """torch-pruning's MagnitudePruner with channel_plan's alignment: its own `round_to`
    rounds the kept channels down to 0 for groups narrower than round_to and then leaves them
    whole. `_round_to` is private to torch-pruning; the pinned 1.6.1 calls it per group with
    the count to remove and the group's width."""

    class AlignedPruner(tp.pruner.MagnitudePruner):
        def _round_to(self, n_pruned: int, current_channels: int, round_to: int) -> int:
            keep = aligned_count(current_channels - n_pruned, current_channels, round_to)
            return current_channels - keep

    return AlignedPruner


def torch_macs(model: torch.nn.Module, example: tuple[torch.Tensor, ...]) -> int:
    """Multiply-accumulates of one sample: output positions x weight elements per Conv /
    Linear (as runtimes.common.kernel_macs counts an artifact)."""
    total = [0]

    def count(module: Any, inputs: Any, output: torch.Tensor) -> None:
        channels_axis = 1 if isinstance(module, torch.nn.modules.conv._ConvNd) else -1
        positions = output[:1].numel() // output.shape[channels_axis]
        total[0] += positions * module.weight.numel()

    hooks = [m.register_forward_hook(count) for m in model.modules() if isinstance(m, KERNELS)]
    try:
        with torch.no_grad():
            model.eval()(*(x[:1] for x in example))
    finally:
        for hook in hooks:
            hook.remove()
    return total[0]


def _params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _module(model: torch.nn.Module, name: str) -> torch.nn.Module:
    return model.get_submodule(name) if name else model


def _torch_pruning() -> Any:
    require("torch_pruning", "torch-pruning==1.6.1", "channel pruning of PyTorch models")
    import torch_pruning

    return torch_pruning

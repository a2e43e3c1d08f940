"""Channel pruning of nn.Modules with torch-pruning (DepGraph): a smaller dense model.

torch-pruning traces the module once and groups every coupled channel set (residual adds,
concatenations, depthwise convs, BatchNorm); each group keeps its channels of largest L2
norm. The classifier head (the last Conv / Linear run) keeps its outputs, and modules whose
own parameters torch-pruning does not know how to slice (custom layers) are left whole.
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import torch

from compressor.backends.channel_plan import ChannelPruning, aligned_count, channel_ratio
from compressor.backends.torch.attention_heads import head_splits, pruner_options
from compressor.backends.torch.env import require
from compressor.backends.torch.infer import example_input
from compressor.backends.torch.io import as_tensors, flat_outputs
from compressor.backends.torch.load import clone_module
from compressor.backends.torch.train import fine_tune, is_exported
from compressor.errors import BackendUnavailableError, first_line
from compressor.steps import DistillConfig

if TYPE_CHECKING:
    from compressor.context import Context, ModelState
    from compressor.steps import PruneConfig

KERNELS = (torch.nn.modules.conv._ConvNd, torch.nn.Linear)
EXAMPLE_ROWS = 2
# Modules with parameters that torch-pruning slices itself; others with parameters of their
# own are "custom" and left whole.
KNOWN = (*KERNELS, torch.nn.modules.batchnorm._BatchNorm, torch.nn.LayerNorm, torch.nn.GroupNorm,
         torch.nn.PReLU, torch.nn.Embedding, torch.nn.MultiheadAttention, torch.nn.LSTM)


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
    kept_whole = _left_whole(original, example)

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
    if config.epochs > 0:
        fine_tune(pruned, config, ctx, f"channel pruning {ratio:.0%}, fine-tuning", None,
                  state.last(DistillConfig))
    section = ChannelPruning(
        ratio=ratio, target_macs=config.target_macs, groups_pruned=groups[0],
        model_before={"params": _params(original), "macs": torch_macs(original, example)},
        model_after={"params": _params(pruned), "macs": torch_macs(pruned, example)},
        attention_heads=heads[0],
        kept_whole=tuple({"layers": [name], "reason": reason} for name, reason in kept_whole))
    ctx.record.add_section(section)
    return state.replace(model=pruned.eval())


def _prune(model: torch.nn.Module, example: tuple[torch.Tensor, ...], ratio: float,
           ignored: list[torch.nn.Module], multiple: int) -> tuple[int, tuple[dict[str, Any], ...]]:
    """Prune `model` in place; the number of channel groups it pruned and, per attention
    module that lost whole heads, its head counts."""
    tp = _torch_pruning()
    splits = list(head_splits(model))
    try:
        with warnings.catch_warnings():
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
    except (RuntimeError, ValueError, TypeError, KeyError, IndexError) as exc:
        raise BackendUnavailableError(f"torch-pruning cannot prune {type(model).__name__} by "
                                      f"channels ({first_line(exc)}); use structure: "
                                      "unstructured") from None


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


def _left_whole(model: torch.nn.Module, example: tuple[torch.Tensor, ...]) -> list[tuple[str, str]]:
    """(module name, reason) for the modules whose output channels stay: those that make a
    model output (e.g. the classifier head) and every Conv / Linear whose channel group
    reaches a custom module (parameters torch-pruning does not know how to slice)."""
    outputs = _output_makers(model, example)
    if not outputs:
        return []
    left = [(name, "a model output (e.g. the classifier head)") for name in outputs]
    names = {module: name for name, module in model.named_modules()}
    tp = _torch_pruning()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # "unwrapped parameters": handled here
        graph = tp.DependencyGraph().build_dependency(model, example_inputs=example)
    for group in graph.get_all_groups(ignored_layers=[_module(model, n) for n in outputs],
                                      root_module_types=list(KERNELS)):
        custom = [dep.target.module for dep, _ in group if _is_custom(dep.target.module)]
        # The modules whose outputs are these channels (others only read them).
        producers = [dep.target.module for dep, _ in group if isinstance(dep.target.module, KERNELS)
                     and getattr(dep.handler, "__name__", "") == "prune_out_channels"]
        if custom:
            culprit = names.get(custom[0], "a bare parameter")
            left += [(names[t], f"its channels reach custom layer {culprit} "
                      f"({type(custom[0]).__name__}), which cannot be sliced safely")
                     for t in dict.fromkeys(producers) if names[t] not in dict(left)]
    return left


def _output_makers(model: torch.nn.Module, example: tuple[torch.Tensor, ...]) -> list[str]:
    """Names of the modules whose output channels are the model's outputs: for each output
    tensor (tuple / dict outputs too), the nearest modules with parameters of their own it
    was computed from, through parameter-free steps (activations, pooling, a final add)."""
    owners = {module: name for name, module in model.named_modules()
              if any(True for _ in module.parameters(recurse=False))}
    made_by: dict[Any, str] = {}

    def record(module: torch.nn.Module, inputs: Any, output: Any) -> None:
        for _, tensor in flat_outputs(output):
            if tensor.grad_fn is not None:
                made_by[tensor.grad_fn] = owners[module]

    frozen = [p for p in model.parameters() if not p.requires_grad]
    hooks = [module.register_forward_hook(record) for module in owners]
    try:
        for parameter in frozen:   # autograd's graph is the trace; frozen weights leave none
            parameter.requires_grad_(True)
        with torch.enable_grad():
            outputs = model.eval()(*example)
    finally:
        for parameter in frozen:
            parameter.requires_grad_(False)
        for hook in hooks:
            hook.remove()
    found: list[str] = []
    seen: set[Any] = set()
    pending = [t.grad_fn for _, t in flat_outputs(outputs) if t.grad_fn is not None]
    while pending:
        step = pending.pop()
        if step in seen:
            continue
        seen.add(step)
        if step in made_by:
            found.append(made_by[step])
        else:
            pending += [following for following, _ in step.next_functions if following is not None]
    return list(dict.fromkeys(found))


def _is_custom(target: Any) -> bool:
    if isinstance(target, torch.nn.Parameter):
        return True   # torch-pruning's "unwrapped parameter": a custom module's own weight
    return isinstance(target, torch.nn.Module) and not isinstance(target, KNOWN) and \
        any(True for _ in target.parameters(recurse=False))


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

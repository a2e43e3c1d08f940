"""Which channel groups of an nn.Module torch-pruning may cut, and which stay whole and why.

torch-pruning (DepGraph) traces the module once and groups every coupled channel set. Some
groups must stay whole: those whose channels are a model output (the classifier head, a
returned feature map), those that reach a custom module or a bare nn.Parameter (weights
torch-pruning does not know how to slice: a ViT's class token and position embedding), and
those that pass a reshape splitting or merging the channel axis (ShuffleNet's channel
shuffle: view (N, g, C/g, H, W), transpose, view back), whose channel order torch-pruning
cannot follow. torch-pruning 1.6.1 divides by zero on such a reshape, or maps it as a
flatten and slices the wrong channels; here it is left alone and its groups are kept whole.
"""
from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from compressor.backends.torch.io import flat_outputs

KERNELS = (torch.nn.modules.conv._ConvNd, torch.nn.Linear)
# Modules with parameters that torch-pruning slices itself; others with parameters of their
# own are "custom" and left whole.
KNOWN = (*KERNELS, torch.nn.modules.batchnorm._BatchNorm, torch.nn.LayerNorm, torch.nn.GroupNorm,
         torch.nn.PReLU, torch.nn.Embedding, torch.nn.MultiheadAttention, torch.nn.LSTM)
OUTPUT_REASON = "a model output (e.g. the classifier head)"
RESHAPE_REASON = ("its channels pass a split, or a reshape that splits or merges the channel "
                  "axis (e.g. a channel shuffle), which torch-pruning cannot follow")


@dataclass
class GroupPlan:
    """`kept_whole`: (module name, reason) per Conv / Linear whose output channels stay;
    `widths`: channel count per group root (a Conv / Linear name) of every group the step is
    asked to cut, those kept whole for a custom layer or a reshape included (groups making a
    model output keep their width by design and are not counted)."""

    kept_whole: list[tuple[str, str]] = field(default_factory=list)
    widths: dict[str, int] = field(default_factory=dict)


def out_channels(module: torch.nn.Module) -> int:
    return module.out_channels if isinstance(module, torch.nn.modules.conv._ConvNd) \
        else module.out_features


def keeps_channel_order(before: Sequence[int], after: Sequence[int]) -> bool:
    """Whether a reshape of a feature map (N, C, ...) from `before` to `after` leaves its
    channel axis whole: dims 0 and 1 kept, or a flatten to (N, C x ...) (torch-pruning maps
    flattens). Tensors of rank < 4 (vectors, token sequences with channels last) always do:
    torch-pruning's own rules decide them, as before."""
    before, after = list(before), list(after)
    if len(before) < 4 or before == after:
        return True
    if after[:2] == before[:2]:
        return True
    return len(after) == 2 and after[0] == before[0] and after[1] == math.prod(before[1:])


def splits_channels(sizes: Sequence[int], dim: int) -> bool:
    """Whether a split / chunk of a tensor of shape `sizes` along `dim` cuts its channel axis:
    dim 1 (N, C, ...), or the last dim of a token sequence (N, T, C: q, k, v = qkv.chunk(3, -1))."""
    rank = len(sizes)
    dim = dim - 2 ** 64 if dim >= 2 ** 63 else dim   # autograd saves dim -1 as an unsigned int
    dim = dim % rank if rank else dim
    return dim == 1 or (rank == 3 and dim == 2)


@contextlib.contextmanager
def mappings_checked(tp: Any) -> Iterator[set[Any]]:
    """While active, torch-pruning's index mapping skips the reshapes that split or merge a
    feature map's channel axis and the splits of a channel axis (and any reshape it fails on),
    and collects their graph nodes in the yielded set, so their groups can be kept whole.

    torch-pruning 1.6.1 divides by zero on such a reshape or maps it as a flatten; on torch
    2.13 it infers a chunk's sizes from the consumers (a concat's total width for ShuffleNet's
    `x.chunk(2, 1)`) and fails on the offsets. A group passing a split is not cut in any case:
    the model's code fixes the split sizes (or splits in equal parts), and torch-pruning may
    remove more channels from one part than from another."""
    from torch_pruning.dependency import index_mapping

    originals = (index_mapping.update_reshape_index_mapping,
                 index_mapping.update_split_index_mapping)
    unfollowed: set[Any] = set()

    def reshape(graph: Any, node: Any) -> None:
        grad_fn = node.grad_fn
        before = getattr(grad_fn, "_saved_self_sym_sizes", None)
        metadata = getattr(grad_fn, "_input_metadata", ())
        if before is not None and metadata and \
                not keeps_channel_order(before, list(metadata[0].shape)):
            unfollowed.add(node)
            return
        try:
            originals[0](graph, node)
        except ArithmeticError:   # e.g. ZeroDivisionError on a channel count it inferred as 0
            unfollowed.add(node)

    def split(graph: Any, node: Any) -> None:
        sizes = getattr(node.grad_fn, "_saved_self_sym_sizes", None)
        dim = getattr(node.grad_fn, "_saved_dim", None)
        if sizes is None or dim is None or splits_channels(sizes, dim):
            unfollowed.add(node)
            return
        originals[1](graph, node)

    index_mapping.update_reshape_index_mapping = reshape
    index_mapping.update_split_index_mapping = split
    try:
        yield unfollowed
    finally:
        index_mapping.update_reshape_index_mapping, index_mapping.update_split_index_mapping = \
            originals


def plan_groups(tp: Any, model: torch.nn.Module, example: tuple[torch.Tensor, ...]) -> GroupPlan:
    """The GroupPlan of `model` traced on `example`."""
    outputs = output_makers(model, example)
    plan = GroupPlan([(name, OUTPUT_REASON) for name in outputs])
    names = {module: name for name, module in model.named_modules()}
    names.update({parameter: name for name, parameter in model.named_parameters()})
    ignored = [model.get_submodule(name) if name else model for name in outputs]
    with warnings.catch_warnings(), mappings_checked(tp) as unfollowed:
        warnings.simplefilter("ignore", UserWarning)   # "unwrapped parameters": handled here
        graph = tp.DependencyGraph().build_dependency(model, example_inputs=example)
        # (grouping re-runs the index mapping: still inside mappings_checked)
        groups = list(graph.get_all_groups(ignored_layers=ignored,
                                           root_module_types=list(KERNELS)))
    for group in groups:
        root = group[0][0].target.module
        plan.widths[names[root]] = out_channels(root)
        reason = _whole_because(group, model, names, unfollowed)
        if reason:
            # The modules whose outputs are these channels (others only read them).
            producers = [dep.target.module for dep, _ in group
                         if isinstance(dep.target.module, KERNELS)
                         and getattr(dep.handler, "__name__", "") == "prune_out_channels"]
            kept = dict(plan.kept_whole)
            plan.kept_whole += [(names[t], reason) for t in dict.fromkeys(producers)
                                if names[t] not in kept]
    return plan


def _whole_because(group: Any, model: torch.nn.Module, names: dict[Any, str],
                   unfollowed: set[Any]) -> str:
    """Why `group` must stay whole ('' when it may be cut)."""
    custom = [dep.target.module for dep, _ in group if _is_custom(dep.target.module)]
    if custom:
        culprit = custom[0]
        if isinstance(culprit, torch.nn.Parameter):   # torch-pruning's "unwrapped" parameter
            name = names.get(culprit, "")
            owner = model.get_submodule(name.rpartition(".")[0]) if name else None
            if owner is not None and not _container(owner):
                culprit = owner   # a custom layer's own weight
        if isinstance(culprit, torch.nn.Parameter):   # a container's, e.g. a ViT's class token
            what = f"nn.Parameter {names.get(culprit, '(unnamed)')}"
            what += f" of {type(owner).__name__}" if owner is not None else ""
        else:
            what = f"custom layer {names.get(culprit, '?')} ({type(culprit).__name__})"
        return f"its channels reach {what}, which cannot be sliced safely"
    if any(dep.target in unfollowed or dep.source in unfollowed for dep, _ in group):
        return RESHAPE_REASON
    return ""


def output_makers(model: torch.nn.Module, example: tuple[torch.Tensor, ...]) -> list[str]:
    """Names of the modules whose output channels are the model's outputs: for each output
    tensor (tuple / dict outputs too), the nearest modules with parameters of their own it
    was computed from, through parameter-free steps (activations, pooling, a final add).
    A container with parameters of its own (a ViT holding its class token) is walked through:
    its output was made by its children, and ignoring it would ignore them all."""
    owners = {module: name for name, module in model.named_modules()
              if any(True for _ in module.parameters(recurse=False)) and not _container(module)}
    made_by: dict[Any, str] = {}

    def record(module: torch.nn.Module, inputs: Any, output: Any) -> None:
        for _, tensor in flat_outputs(output):
            if tensor.grad_fn is not None:
                made_by.setdefault(tensor.grad_fn, owners[module])

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


def _container(module: torch.nn.Module) -> bool:
    """A module whose submodules hold parameters, and which torch-pruning does not slice as
    one unit (nn.MultiheadAttention, nn.LSTM are such units)."""
    return not isinstance(module, KNOWN) and any(
        True for child in module.children() for _ in child.parameters())


def _is_custom(target: Any) -> bool:
    if isinstance(target, torch.nn.Parameter):
        return True   # torch-pruning's "unwrapped parameter": a custom module's own weight
    return isinstance(target, torch.nn.Module) and not isinstance(target, KNOWN) and \
        any(True for _ in target.parameters(recurse=False))

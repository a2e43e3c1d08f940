"""Unstructured magnitude pruning of conv / linear weights, per layer, on a private copy.

Masks are plain boolean tensors applied after every optimizer step, so the result holds
ordinary weight tensors with zeros in them (no torch.nn.utils.prune reparametrization).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from compressor.backends.torch.load import clone_module
from compressor.backends.training_data import steps_per_epoch
from compressor.backends.torch.train import fine_tune, is_exported
from compressor.errors import BackendUnavailableError

from compressor.config.steps import DistillConfig

if TYPE_CHECKING:
    from compressor.core.context import Context, ModelState
    from compressor.config.steps import PruneConfig

MASK_UPDATES = 10   # how many times the mask is recomputed while sparsity ramps up (as Keras)
KERNEL_MODULES = (torch.nn.modules.conv._ConvNd, torch.nn.Linear)
KERNEL_OPS = {"conv1d", "conv2d", "conv3d", "convolution", "conv_transpose1d", "conv_transpose2d",
              "conv_transpose3d", "linear"}   # aten ops of exported graphs, weight = args[1]

Masks = dict[str, torch.Tensor]


@dataclass(frozen=True)
class SparsitySchedule:
    """Target sparsity per optimizer step, like tfmot's ConstantSparsity / PolynomialDecay."""

    final: float
    polynomial: bool
    frequency: int
    end_step: int

    @classmethod
    def for_run(cls, config: PruneConfig, steps_per_epoch_: int) -> SparsitySchedule:
        total = steps_per_epoch_ * config.epochs
        # Reach the final sparsity before the last epoch, so that epoch only recovers accuracy.
        ramp = total - steps_per_epoch_ if config.epochs > 1 else max(1, total // 2)
        frequency = max(1, ramp // MASK_UPDATES)
        return cls(final=config.sparsity, polynomial=config.schedule == "polynomial",
                   frequency=frequency, end_step=max(frequency, frequency * (ramp // frequency)))

    def updates_mask(self, step: int) -> bool:
        return step % self.frequency == 0 and (step <= self.end_step or not self.polynomial)

    def reached(self, step: int) -> bool:
        """Whether the weights hold the final sparsity after optimizer step `step`."""
        return not self.polynomial or step >= self.end_step

    def sparsity(self, step: int) -> float:
        if not self.polynomial:
            return self.final
        progress = min(step, self.end_step) / self.end_step
        return self.final * (1.0 - (1.0 - progress) ** 3)


def pruned_model(state: ModelState, config: PruneConfig, ctx: Context) -> torch.nn.Module:
    """A copy of the model whose conv / linear weights are `config.sparsity` zeros, fine-tuned
    (with the teacher's KD loss after a distill step)."""
    working = clone_module(state.model)
    kernels = prunable_kernels(working)
    if config.epochs > 0:
        description = f"pruning to {config.sparsity:.0%}"
        schedule = SparsitySchedule.for_run(config, steps_per_epoch(ctx, config, description))
        # Only epochs at the final sparsity may be kept as the best (keep_best).
        fine_tune(working, config, ctx, description, ScheduledMasks(kernels, schedule).after_step,
                  state.last(DistillConfig), eligible=schedule.reached)
    # Exactly the final sparsity in every layer, also for epochs: 0 (one-shot).
    apply_masks(kernels, magnitude_masks(kernels, config.sparsity))
    return working


class ScheduledMasks:
    """Masks that follow a schedule: `after_step(step)` recomputes them when the schedule says
    so and re-applies them. The backend's loop and a user's own loop both drive it."""

    def __init__(self, kernels: dict[str, torch.nn.Parameter], schedule: SparsitySchedule):
        self.kernels, self.schedule = kernels, schedule
        self.masks = magnitude_masks(kernels, schedule.sparsity(0))
        apply_masks(kernels, self.masks)

    def after_step(self, step: int) -> None:
        if self.schedule.updates_mask(step):
            self.masks = magnitude_masks(self.kernels, self.schedule.sparsity(step))
        apply_masks(self.kernels, self.masks)


def prunable_kernels(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """kernel_parameters, or a typed error for a model with nothing to prune."""
    kernels = kernel_parameters(model)
    if not kernels:
        raise BackendUnavailableError(f"{type(model).__name__} has no Conv or Linear weights to "
                                      "prune; remove the prune step for this model")
    return kernels


def kernel_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """Conv / linear weights by name: from the modules, or from the ops of an exported graph."""
    kernels = {_join(name, "weight"): module.weight for name, module in model.named_modules()
               if isinstance(module, KERNEL_MODULES)
               and isinstance(getattr(module, "weight", None), torch.nn.Parameter)}
    if kernels or not is_exported(model):
        return kernels
    for node in model.graph.nodes:
        op_name = getattr(node.target, "__name__", "").split(".")[0]
        if node.op == "call_function" and op_name in KERNEL_OPS and len(node.args) > 1:
            source = node.args[1]
            while getattr(source, "op", None) == "call_module":   # through fake-quant modules
                source = source.args[0]
            if getattr(source, "op", None) == "get_attr":
                try:
                    kernels[source.target] = model.get_parameter(source.target)
                except AttributeError:
                    continue   # a constant (an int8-converted graph), nothing to train or prune
    return kernels


def magnitude_masks(kernels: dict[str, torch.nn.Parameter], sparsity: float) -> Masks:
    """Per layer: False for the round(sparsity x size) smallest-magnitude weights."""
    masks = {}
    for name, weight in kernels.items():
        count = int(round(sparsity * weight.numel()))
        mask = torch.ones(weight.numel(), dtype=torch.bool, device=weight.device)
        if count:
            smallest = torch.topk(weight.detach().abs().flatten(), count, largest=False).indices
            mask[smallest] = False
        masks[name] = mask.view_as(weight)
    return masks


def zero_masks(kernels: dict[str, torch.nn.Parameter]) -> Masks:
    """Masks that keep today's zeros at zero (sparsity-preserving fine-tuning, e.g. QAT)."""
    return {name: weight.detach() != 0 for name, weight in kernels.items()}


def apply_masks(kernels: dict[str, torch.nn.Parameter], masks: Masks) -> None:
    with torch.no_grad():
        for name, mask in masks.items():
            kernels[name].mul_(mask)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name

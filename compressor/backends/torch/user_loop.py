"""A recipe's training step inside the user's own PyTorch loop.

The user builds the optimizer over `training.model.parameters()` and calls, per batch,
`loss(outputs, target, inputs=x)`, `backward()`, `optimizer.step()`, then `after_step(n)`,
which keeps the step's masks (pruning schedule, preserved zeros) in the weights.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from compressor.backends.base import UserTraining
from compressor.backends.torch.load import clone_module
from compressor.backends.torch.prune import (ScheduledMasks, SparsitySchedule, apply_masks,
                                             kernel_parameters, magnitude_masks, prunable_kernels,
                                             zero_masks)
from compressor.backends.torch.quant import qat_model
from compressor.backends.training_data import steps_per_epoch
from compressor.backends.training_rules import PROBE_SAMPLES, keeps_pruned_zeros
from compressor.backends.torch.io import as_tensors, selected_output
from compressor.backends.torch.train import (
    Outputs,
    _distillation_targets_and_loss,
    _targets_and_loss,
    set_mode,
    teacher_logits,
)
from compressor.errors import UsageError
from compressor.core.tensors import take
from compressor.config.steps import DistillConfig

if TYPE_CHECKING:
    from compressor.core.context import Context, ModelState
    from compressor.config.steps import StepConfig


class ExportedForTraining(torch.nn.Module):
    """A PT2E (torch.export) graph behind an ordinary module: `.train()` / `.eval()` work, as
    user loops call them (exported graphs raise NotImplementedError on both)."""

    def __init__(self, graph: torch.fx.GraphModule):
        super().__init__()
        self.graph = graph

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.graph(*args, **kwargs)

    def train(self, mode: bool = True) -> ExportedForTraining:
        set_mode(self.graph, mode)
        self.training = mode
        return self


def start_user_training(state: ModelState, step: StepConfig | None, ctx: Context,
                        steps_per_epoch_: int | None) -> UserTraining:
    kind = step.kind if step is not None else None
    masks = after_step = None
    if kind == "prune" and not step.leaves_zeros:
        # Channels go first, in one shot; the user's loop then fine-tunes the smaller model.
        from compressor.backends.torch.channels import channel_pruned

        state, kind = channel_pruned(state, step.model_copy(update={"epochs": 0}), ctx), None
    if kind == "prune":
        model = clone_module(state.model)
        steps = steps_per_epoch_ or steps_per_epoch(ctx, step, f"pruning to {step.sparsity:.0%}")
        masks = ScheduledMasks(prunable_kernels(model), SparsitySchedule.for_run(step, steps))
        after_step = masks.after_step
    elif kind == "quantize":
        # epochs 0: the backend prepares (and calibrates) the fake-quant graph; the user trains.
        graph = qat_model(state, step.model_copy(update={"epochs": 0}), ctx)
        model = ExportedForTraining(graph)
        kernels = kernel_parameters(graph)
        masks = (kernels, zero_masks(kernels) if keeps_pruned_zeros(state, step) else {})

        def after_step(_step: int) -> None:
            apply_masks(*masks)   # pruned weights stay exactly zero
    else:
        model = clone_module(state.model)
    distill = step if kind == "distill" else state.last(DistillConfig)
    distill = distill if distill is not None and distill.guides(step) else None
    loss = _user_loss(model, ctx, distill)
    set_mode(model, training=True)
    return UserTraining(state=state, step=step, model=model, loss=loss, after_step=after_step,
                        backend_state=masks)


def end_user_training(training: UserTraining, ctx: Context) -> ModelState:
    step, state, model = training.step, training.state, training.model
    kind = step.kind if step is not None else None
    set_mode(model, training=False)
    model.cpu()   # a loop may train on a GPU; export and validation run on the CPU
    if kind == "prune" and step.leaves_zeros:
        kernels = training.backend_state.kernels
        # Exactly the recipe's sparsity, also when the loop stopped before the schedule's end.
        apply_masks(kernels, magnitude_masks(kernels, step.sparsity))
        return state.replace(model=model)
    if kind == "quantize":
        apply_masks(*training.backend_state)   # in case the last optimizer step had no run.step()
        return state.replace(model=model.graph)   # training_run sets the qat scheme
    return state.replace(model=model)


def _user_loss(model: torch.nn.Module, ctx: Context,
               distill: DistillConfig | None) -> Callable[..., torch.Tensor]:
    """The backend's own loss, probed on a few samples: cross-entropy (NLL for softmax
    outputs) with labels, MSE to a given target without; plus the teacher's term."""
    x, y = ctx.data.train if ctx.data.train is not None else ctx.data.val
    names = [spec.name for spec in ctx.inputs] or None
    probe = as_tensors(model, take(x, slice(0, PROBE_SAMPLES)), names)
    labels = None if y is None else np.asarray(y)[:PROBE_SAMPLES]
    read = Outputs(ctx.output_index)
    if distill is None:
        _, task_loss = _targets_and_loss(model, probe, labels, read)
        return lambda outputs, target, inputs=None: task_loss(
            selected_output(outputs, ctx.output_index), target)
    _, kd_loss = _distillation_targets_and_loss(model, probe, labels, distill, ctx.teacher, read)

    def loss(outputs: Any, target: Any, inputs: Any = None) -> torch.Tensor:
        if inputs is None:
            raise UsageError("while distilling, run.loss needs the batch's inputs for the "
                             "teacher: run.loss(outputs, target, inputs=x)")
        outputs = selected_output(outputs, ctx.output_index)
        batch = [inputs] if torch.is_tensor(inputs) else as_tensors(ctx.teacher, inputs, names)
        device = next(ctx.teacher.parameters(), batch[0]).device   # the teacher stays where it is
        teacher = teacher_logits(ctx.teacher, [t.to(device) for t in batch], read).to(outputs.device)
        targets = (teacher,) if labels is None else (target, teacher)
        return kd_loss(outputs, *targets)

    return loss

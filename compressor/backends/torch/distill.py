"""Knowledge distillation for PyTorch: the student trains on a frozen teacher's soft targets.

The KD loss and the keep-zeros rule are framework-neutral (backends/training_rules.py); the
one training loop (torch_train.distillation_loss) applies the loss, which pruning and QAT also
use while a distill step guides them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from compressor.backends.torch.load import clone_module
from compressor.backends.torch.prune import apply_masks, kernel_parameters, zero_masks
from compressor.backends.torch.train import fine_tune
from compressor.backends.training_rules import keeps_pruned_zeros

if TYPE_CHECKING:
    from compressor.core.context import Context, ModelState
    from compressor.config.steps import DistillConfig


def distilled_model(state: ModelState, config: DistillConfig, ctx: Context) -> torch.nn.Module:
    """A copy of the model trained `config.epochs` with the KD loss against `ctx.teacher`.

    After a prune step, the pruned kernel weights are re-zeroed after every update, so
    distilling never refills the sparsity the recipe asked for.
    """
    working = clone_module(state.model)
    kernels = kernel_parameters(working)
    masks = zero_masks(kernels) if keeps_pruned_zeros(state, config) else {}
    return fine_tune(working, config, ctx, "distilling from the teacher",
                     after_step=lambda step: apply_masks(kernels, masks), distill=config)

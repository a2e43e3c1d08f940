"""Knowledge distillation for PyTorch: the student trains on a frozen teacher's soft targets.

The KD loss itself lives in the one training loop (torch_train.distillation_loss), which
pruning and QAT also use while a distill step is active.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from compressor.backends.torch_load import clone_module
from compressor.backends.torch_prune import apply_masks, kernel_parameters, zero_masks
from compressor.backends.torch_train import fine_tune

if TYPE_CHECKING:
    from compressor.context import Context
    from compressor.passes.distill import DistillConfig


def distilled_model(model: torch.nn.Module, config: DistillConfig, keep_zeros: bool,
                    ctx: Context) -> torch.nn.Module:
    """A copy of `model` trained `config.epochs` with the KD loss against `ctx.teacher`.

    `keep_zeros` (after a prune step) re-zeroes the pruned kernel weights after every
    update, so distilling never refills the sparsity the recipe asked for.
    """
    working = clone_module(model)
    kernels = kernel_parameters(working)
    masks = zero_masks(kernels) if keep_zeros else {}
    return fine_tune(working, config, ctx, "distilling from the teacher",
                     after_step=lambda step: apply_masks(kernels, masks), distill=config)

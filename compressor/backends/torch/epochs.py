"""What the PyTorch loop does around its batches when it fine-tunes a trained model: the
optimizer and its per-step learning rate, the val metric after each epoch and the weights
of the best one (backends/fine_tuning.py decides; this module measures and restores), and
BatchNorm statistics frozen for QAT.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

from compressor.backends.fine_tuning import (ADAMW_WEIGHT_DECAY, SGD_MOMENTUM, EpochRecord,
                                             TrainingHistory, peak_lr, val_score, val_targets)
from compressor.backends.torch.io import as_tensors

if TYPE_CHECKING:
    from compressor.core.context import Context
    from compressor.config.steps import TrainingConfig

# aten batch-norm ops whose args[5] is `training` (torch.export graphs in train mode)
TRAINING_BATCH_NORM_OPS = ("aten.batch_norm.", "aten._native_batch_norm_legit.",
                           "aten.cudnn_batch_norm.", "aten.miopen_batch_norm.")


def optimizer_for(parameters: list[torch.nn.Parameter],
                  config: TrainingConfig) -> torch.optim.Optimizer:
    """The recipe's optimizer at its peak rate; the loop sets each step's rate (lr_at)."""
    lr = peak_lr(config)
    if config.optimizer == "sgd":
        return torch.optim.SGD(parameters, lr=lr, momentum=SGD_MOMENTUM)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(parameters, lr=lr, weight_decay=ADAMW_WEIGHT_DECAY)
    return torch.optim.Adam(parameters, lr=lr)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


class EpochJudge:
    """Scores the model on ctx.data.val after each epoch, records the epoch in `history`,
    keeps a copy of the best eligible epoch's weights (keep_best) and says when to stop.

    Under data-parallel training every rank uses rank 0's score, so all ranks keep the same
    epoch and stop together (their BatchNorm buffers may differ by the last local batch)."""

    def __init__(self, model: torch.nn.Module, ctx: Context, config: TrainingConfig,
                 history: TrainingHistory, set_mode: Callable[[torch.nn.Module, bool], None],
                 read: Callable[[torch.nn.Module, list[torch.Tensor]], torch.Tensor],
                 parallel: bool = False):
        self.model, self.config, self.history = model, config, history
        self.set_mode, self.read, self.parallel = set_mode, read, parallel
        self.labels, self.reference = val_targets(ctx)
        self.inputs = None
        if ctx.data.val is not None and (self.labels is not None or self.reference is not None):
            self.inputs = as_tensors(model, ctx.data.val[0], [s.name for s in ctx.inputs] or None)
        self.best: dict[str, torch.Tensor] | None = None

    def end_epoch(self, epoch: int, loss: float, lr: float, eligible: bool = True) -> bool:
        """Record the epoch (1-based); True when training should stop early."""
        score = self._score()
        if score is not None:
            self.history.metric = score[0]
        entry = EpochRecord(epoch=epoch, loss=loss, lr=lr,
                            val_metric=None if score is None else score[1])
        if self.history.record(entry, eligible) and self.config.keep_best:
            self.best = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return self.history.should_stop(self.config.early_stop)

    def restore_best(self) -> None:
        """The best epoch's weights, unless the last epoch is the best (or none was judged)."""
        if self.best is not None and self.history.best_is_earlier:
            self.model.load_state_dict(self.best)

    def _score(self) -> tuple[str, float] | None:
        if self.inputs is None:
            return None
        self.set_mode(self.model, False)
        with observers_paused(self.model):   # val data must not move QAT's ranges
            outputs = self.read(self.model, self.inputs).float().numpy()
        score = val_score(outputs, self.labels, self.reference)
        if score is not None and self.parallel:
            value = torch.tensor([score[1]], dtype=torch.float64)
            torch.distributed.broadcast(value, src=0)
            score = (score[0], float(value[0]))
        return score


def fake_quantizers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """QAT's fake-quantize modules (those with an observer_enabled flag), without importing
    torchao."""
    return [m for m in model.modules()
            if isinstance(getattr(m, "observer_enabled", None), torch.Tensor)]


@contextmanager
def observers_paused(model: torch.nn.Module) -> Iterator[None]:
    """Fake-quant observers (QAT) off for an evaluation, then as they were."""
    flags = [m.observer_enabled for m in fake_quantizers(model)]
    saved = [flag.clone() for flag in flags]
    for flag in flags:
        flag.fill_(0)
    try:
        yield
    finally:
        for flag, before in zip(flags, saved):
            flag.copy_(before)


def freeze_batch_norm(model: torch.nn.Module) -> None:
    """BatchNorm uses and keeps its running statistics while the rest trains: an exported
    (PT2E) graph's batch-norm ops get training=False, as torchao's QAT tutorial does; an
    nn.Module's BatchNorm layers go to eval mode. Switching the model to train mode undoes
    it, so the loop calls this after every switch."""
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.eval()
    if not isinstance(model, torch.fx.GraphModule):
        return
    changed = False
    for node in model.graph.nodes:
        if (node.op == "call_function" and len(node.args) > 5 and node.args[5] is True
                and any(op in str(node.target) for op in TRAINING_BATCH_NORM_OPS)):
            node.args = (*node.args[:5], False, *node.args[6:])
            changed = True
    if changed:
        model.recompile()

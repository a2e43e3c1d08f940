"""What both backends' training loops share when they fine-tune a trained model: the learning
rate at each optimizer step, the val metric an epoch is judged by, and the history that picks
the epoch to keep and says when to stop early. Framework-neutral: numpy only.

A pretrained network is fine-tuned, not trained: a from-scratch rate (Adam at 1e-3) wrecks a
converged ResNet in a few steps, so the default peak rate is 3/10 of it
(steps.TrainingConfig.default_lr_fraction), reached after a short linear warmup and decayed
to 0 along a cosine.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from compressor.core.tensors import output_list

if TYPE_CHECKING:
    from compressor.core.context import Context
    from compressor.config.steps import TrainingConfig

FROM_SCRATCH_LR = {"adam": 1e-3, "adamw": 1e-3, "sgd": 1e-2}
ADAMW_WEIGHT_DECAY = 1e-4
SGD_MOMENTUM = 0.9


def peak_lr(config: TrainingConfig) -> float:
    """The recipe's `lr`, or the default for its optimizer and step kind."""
    return config.lr or FROM_SCRATCH_LR[config.optimizer] * config.default_lr_fraction


def lr_at(step: int, total_steps: int, config: TrainingConfig) -> float:
    """The learning rate for optimizer step `step` (0-based) of `total_steps`."""
    peak = peak_lr(config)
    if config.lr_schedule == "constant" or total_steps <= 1:
        return peak
    warmup_steps = int(total_steps * config.warmup)
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return peak * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def val_score(outputs: np.ndarray, labels: np.ndarray | None,
              reference: np.ndarray | None) -> tuple[str, float] | None:
    """The metric an epoch is judged by, higher is better: val accuracy with labels, else the
    negative MSE to the original model's outputs; None when neither is known."""
    outputs = np.asarray(outputs)
    if labels is not None and outputs.ndim >= 2 and outputs.shape[-1] > 1:
        return "accuracy", float(np.mean(outputs.argmax(axis=-1) == np.asarray(labels)))
    if reference is not None:
        diff = outputs.astype(np.float64) - np.asarray(reference, dtype=np.float64)
        return "neg_mse", -float(np.mean(diff ** 2))
    return None


@dataclass
class EpochRecord:
    epoch: int                      # 1-based
    loss: float                     # mean training loss over the epoch
    lr: float                       # the rate at the epoch's last step
    val_metric: float | None = None


@dataclass
class TrainingHistory:
    """One training step's epochs; `record` says whether the epoch is the best so far."""

    step: str                          # the step's description, e.g. "prune"
    metric: str | None = None          # "accuracy" or "neg_mse"
    epochs: list[EpochRecord] = field(default_factory=list)
    best_epoch: int | None = None
    stopped_early: bool = False

    def record(self, entry: EpochRecord, eligible: bool = True) -> bool:
        """Add an epoch; True when it is eligible and beats every earlier eligible one."""
        self.epochs.append(entry)
        if not eligible or entry.val_metric is None:
            return False
        best = self.best_value
        if best is None or entry.val_metric > best:
            self.best_epoch = entry.epoch
            return True
        return False

    @property
    def best_value(self) -> float | None:
        if self.best_epoch is None:
            return None
        return self.epochs[self.best_epoch - 1].val_metric

    @property
    def best_is_earlier(self) -> bool:
        """An epoch before the last measured best: keep_best puts its weights back."""
        return self.best_epoch is not None and self.best_epoch != self.epochs[-1].epoch

    def should_stop(self, patience: int | None) -> bool:
        """Early stop: `patience` epochs since the best one (never before a best exists)."""
        if patience is None or self.best_epoch is None:
            return False
        stop = self.epochs[-1].epoch - self.best_epoch >= patience
        self.stopped_early = self.stopped_early or stop
        return stop

    def as_dict(self) -> dict[str, Any]:
        return {"step": self.step, "metric": self.metric, "best_epoch": self.best_epoch,
                "stopped_early": self.stopped_early,
                "epochs": [{"epoch": e.epoch, "loss": round(e.loss, 6), "lr": e.lr,
                            "val_metric": None if e.val_metric is None
                            else round(e.val_metric, 6)} for e in self.epochs]}


def start_history(ctx: Context, description: str) -> TrainingHistory:
    """A new history for one training step, appended to the run's (report.json `history`)."""
    history = TrainingHistory(step=description)
    ctx.record.add_history(history)
    return history


def val_targets(ctx: Context) -> tuple[np.ndarray | None, np.ndarray | None]:
    """What `val_score` judges the selected output (ctx.output_index) by: the val labels and
    the original model's same output on the val inputs (either may be None)."""
    labels = None if ctx.data.val is None or ctx.data.val[1] is None else np.asarray(ctx.data.val[1])
    reference = ctx.reference_outputs
    if reference is not None:
        every = output_list(reference)
        reference = every[min(ctx.output_index, len(every) - 1)]
    return labels, reference


def _largest(values: Any) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def record_training(ctx: Context, description: str, facts: dict[str, Any]) -> None:
    """report.json `training` of a classic model: the fine-tuning's steps, seconds, peak RSS
    and heap (their increase over the process before the loop; memory.TrainingMeter) and
    precision, so float32 and bf16 runs of a recipe compare side by side. A recipe with
    several training steps (prune, then QAT) sums steps and seconds, keeps the largest peak
    and lists each step under `by_step`."""
    by_step = {**(ctx.record.notes.get("training") or {}).get("by_step", {}), description: facts}
    steps = list(by_step.values())
    ctx.record.add_note("training", {
        "steps": sum(f["steps"] for f in steps),
        "seconds": round(sum(f["seconds"] for f in steps), 2),
        "peak_rss_bytes": max(f["peak_rss_bytes"] for f in steps),
        "peak_rss_increase_bytes": max(f["peak_rss_increase_bytes"] for f in steps),
        "peak_heap_increase_bytes": _largest(f.get("peak_heap_increase_bytes") for f in steps),
        "precision": facts["precision"], "by_step": by_step})

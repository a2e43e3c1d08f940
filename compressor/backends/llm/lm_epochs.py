"""keep_best and early_stop for a language model's training (lm_train.train_windows), judged
as the classic loops judge their epochs (fine_tuning.TrainingHistory, report.json `history`).

One calibration window in VAL_SHARE is held back from training. After each epoch the
training's own loss (KL from the teacher, or the next-token cross-entropy) is measured on
those windows without gradients; the history records it negated (`neg_val_loss`: higher is
better). The best epoch's trainable weights wait in a file, not in memory (a 135M model's
float32 latents are 0.5 GB, as much as a bf16 training saves), and are put back at the end
when a later epoch measured worse. Under `--workers N` every rank holds the same weights and
measures the same windows, so all keep the same epoch.
"""
from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from compressor.backends.fine_tuning import EpochRecord, TrainingHistory

VAL_SHARE = 16     # 1 window in 16 judges the epochs (7 of SmolLM2's 121 built-in windows)
METRIC = "neg_val_loss"


def held_back(windows: np.ndarray, config: Any) -> tuple[np.ndarray, np.ndarray]:
    """(the training windows, the windows that judge each epoch): none held back when the
    recipe keeps the last epoch and never stops early, or the text is too short to spare one."""
    held = len(windows) // VAL_SHARE
    if not held or not (config.keep_best or config.early_stop):
        return windows, windows[:0]
    return windows[:-held], windows[-held:]


class EpochJudge:
    """Measures each epoch on `val` windows, records it in `history` and keeps the best."""

    def __init__(self, val: np.ndarray, batch: int, loss_of: Callable[[torch.Tensor], torch.Tensor],
                 weights: list[torch.Tensor], config: Any, history: TrainingHistory | None):
        self.val, self.batch, self.loss_of, self.weights = val, batch, loss_of, weights
        self.config = config
        self.history = history if history is not None else TrainingHistory(step="")
        self.history.metric = METRIC if len(val) else None
        self._folder: tempfile.TemporaryDirectory | None = None   # made at the first keep

    def end_epoch(self, epoch: int, loss: float, lr: float) -> bool:
        """Record the epoch (1-based); True when training should stop early."""
        score = -self._val_loss() if len(self.val) else None
        if self.history.record(EpochRecord(epoch=epoch, loss=loss, lr=lr, val_metric=score)) \
                and self.config.keep_best:
            self._folder = self._folder or tempfile.TemporaryDirectory(prefix="compressor-best-")
            torch.save([w.detach() for w in self.weights], self._best)
        return self.history.should_stop(self.config.early_stop)

    @property
    def kept_epoch(self) -> int | None:
        """The epoch whose weights training ends with (None when no epoch was judged)."""
        if self.history.best_epoch is None or self._folder is not None:
            return self.history.best_epoch
        return self.history.epochs[-1].epoch      # judged, but keep_best is off

    def restore_best(self) -> None:
        """The best epoch's weights, unless the last epoch is the best (or none was judged)."""
        if self._folder is None:
            return
        try:
            if self.history.best_is_earlier:
                with torch.no_grad():
                    for weight, kept in zip(self.weights, torch.load(self._best)):
                        weight.copy_(kept)
        finally:
            self._folder.cleanup()

    @property
    def _best(self) -> Path:
        return Path(self._folder.name) / "best.pt"

    @torch.no_grad()
    def _val_loss(self) -> float:
        total = 0.0
        for first in range(0, len(self.val), self.batch):
            ids = torch.as_tensor(self.val[first:first + self.batch])
            total += float(self.loss_of(ids)) * len(ids)
        return total / len(self.val)

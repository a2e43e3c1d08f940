"""The training split as every backend's training loop and calibration read it."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from compressor.errors import DataError

if TYPE_CHECKING:
    from compressor.context import Context
    from compressor.registry import TrainingConfig


def training_inputs(ctx: Context, purpose: str) -> tuple[np.ndarray, np.ndarray | None]:
    """The training split, or a DataError saying that `purpose` needs one."""
    if ctx.data.train is None or len(ctx.data.train[0]) == 0:
        raise DataError(f"{purpose} needs training data, but {ctx.data.name} has no train split; "
                        "pass data with x_train (and y_train), or set epochs: 0")
    x, y = ctx.data.train
    return np.asarray(x), (None if y is None else np.asarray(y))


def steps_per_epoch(ctx: Context, config: TrainingConfig, purpose: str) -> int:
    return math.ceil(len(training_inputs(ctx, purpose)[0]) / config.batch_size)

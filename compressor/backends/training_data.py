"""The training split as every backend's training loop and calibration read it."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from compressor.errors import DataError
from compressor.core.tensors import Arrays, is_named, rows, take

if TYPE_CHECKING:
    from compressor.core.context import Context
    from compressor.config.steps import TrainingConfig


def training_inputs(ctx: Context, purpose: str) -> tuple[Arrays, np.ndarray | None]:
    """The training split (inputs: an array, or a dict name -> array), or a DataError saying
    that `purpose` needs one."""
    if ctx.data.train is None or rows(ctx.data.train[0]) == 0:
        raise DataError(f"{purpose} needs training data, but {ctx.data.name} has no train split; "
                        "pass data with x_train (and y_train), or set epochs: 0")
    x, y = ctx.data.train
    x = {k: np.asarray(v) for k, v in x.items()} if is_named(x) else np.asarray(x)
    return x, (None if y is None else np.asarray(y))


def steps_per_epoch(ctx: Context, config: TrainingConfig, purpose: str) -> int:
    return math.ceil(rows(training_inputs(ctx, purpose)[0]) / config.batch_size)


def calibration_samples(ctx: Context, count: int) -> Arrays:
    """`count` training inputs for int8 calibration: a seeded random subset (training splits
    are often ordered by class), in their original order."""
    x, _ = training_inputs(ctx, "int8 calibration")
    chosen = np.random.default_rng(ctx.seed).permutation(rows(x))[:count]
    return take(x, np.sort(chosen))

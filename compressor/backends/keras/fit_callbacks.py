"""The Keras side of fine-tuning a trained model (backends/fine_tuning.py has the shared rules):
the optimizer whose rate at every step is fine_tuning.lr_at, the epoch-end callback that
records the step's history, keeps the best epoch's weights and stops early, and the
BatchNorm freezing of QAT.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from compressor.backends.fine_tuning import (
    ADAMW_WEIGHT_DECAY,
    SGD_MOMENTUM,
    EpochRecord,
    TrainingHistory,
    lr_at,
)
from compressor.backends.keras.env import import_tensorflow, import_tf_keras

if TYPE_CHECKING:
    from compressor.config.steps import TrainingConfig


def fine_tuning_optimizer(config: TrainingConfig, total_steps: int) -> Any:
    """config.optimizer with a rate schedule that is lr_at(step, total_steps, config) at every
    step (a table looked up by the optimizer's step count; the last rate after the end)."""
    tf, tf_keras = import_tensorflow(), import_tf_keras()
    rates = [lr_at(step, total_steps, config) for step in range(max(1, total_steps))]

    class StepRates(tf_keras.optimizers.schedules.LearningRateSchedule):
        def __init__(self, rates: list[float]):
            self.rates = list(rates)
            self.table = tf.constant(self.rates, dtype=tf.float32)

        def __call__(self, step: Any) -> Any:
            index = tf.minimum(tf.cast(step, tf.int32), len(self.rates) - 1)
            return tf.gather(self.table, index)

        def get_config(self) -> dict[str, Any]:
            return {"rates": self.rates}

    schedule = StepRates(rates)
    if config.optimizer == "adamw":
        return tf_keras.optimizers.AdamW(schedule, weight_decay=ADAMW_WEIGHT_DECAY)
    if config.optimizer == "sgd":
        return tf_keras.optimizers.SGD(schedule, momentum=SGD_MOMENTUM)
    return tf_keras.optimizers.Adam(schedule)


def epoch_end_callback(history: TrainingHistory, config: TrainingConfig, steps_per_epoch: int,
                       score: Callable[[Any], tuple[str, float] | None],
                       eligible: Callable[[int], bool]) -> Any:
    """A callback that, after each epoch, records the mean loss, the rate and `score(model)`
    (the val metric, None without val data) in `history`; snapshots the weights when the epoch
    is the best one `eligible(optimizer steps so far)` accepts (config.keep_best); stops fit
    after config.early_stop epochs without a better one. Call its `restore_best()` once training is over."""
    tf_keras = import_tf_keras()
    total = steps_per_epoch * config.epochs

    class EpochEnd(tf_keras.callbacks.Callback):
        best_weights: list | None = None

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            number = epoch + 1
            found = score(self.model)
            if found is not None:
                history.metric = found[0]
            entry = EpochRecord(epoch=number, loss=float((logs or {}).get("loss", math.nan)),
                                lr=lr_at(number * steps_per_epoch - 1, total, config),
                                val_metric=None if found is None else found[1])
            if history.record(entry, eligible(number * steps_per_epoch)) and config.keep_best:
                # Every variable: BatchNorm statistics, pruning masks and int8 ranges too.
                self.best_weights = self.model.get_weights()
            if history.should_stop(config.early_stop):
                self.model.stop_training = True

        def restore_best(self) -> None:
            """Put back the best epoch's weights, unless the last epoch is the best."""
            if self.best_weights is not None and history.best_is_earlier:
                self.model.set_weights(self.best_weights)

    return EpochEnd()


def epoch_phases(epochs: int, freeze_bn_after: int | None) -> list[tuple[int, int, bool]]:
    """(first epoch, end epoch, BatchNorm frozen) spans of one fit: QAT freezes BatchNorm
    statistics after `freeze_bn_after` epochs (0: from the start; None: never)."""
    if freeze_bn_after is None or freeze_bn_after >= epochs:
        return [(0, epochs, False)]
    if freeze_bn_after == 0:
        return [(0, epochs, True)]
    return [(0, freeze_bn_after, False), (freeze_bn_after, epochs, True)]


def freeze_batch_norm(model: Any) -> int:
    """Switch every BatchNormalization layer (also inside tfmot's quantize / prune wrappers
    and nested models) to inference mode: a non-trainable tf_keras BatchNormalization
    normalizes with its moving statistics and no longer updates them (and its scale and
    offset stay fixed). The model must be compiled again to train with it. Returns how many."""
    tf_keras = import_tf_keras()
    frozen = 0
    for layer in _leaf_layers(model):
        if isinstance(layer, tf_keras.layers.BatchNormalization):
            layer.trainable = False
            frozen += 1
    return frozen


def _leaf_layers(layer: Any) -> list:
    inner = getattr(layer, "layer", None)   # tfmot's QuantizeWrapperV2 / PruneLowMagnitude
    if inner is not None:
        return _leaf_layers(inner)
    children = getattr(layer, "layers", None)
    if children is not None:
        return [leaf for child in children for leaf in _leaf_layers(child)]
    return [layer]

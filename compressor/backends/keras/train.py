"""The one training loop of the Keras backend: pruning, QAT and distillation use it.

`fine_tune` creates the model to train, the dataset and the optimizer in one place, so that a
tf.distribute strategy scope can wrap all three without touching the passes.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from compressor.backends.fine_tuning import start_history, val_score, val_targets
from compressor.backends.keras.distribute import build_in_scope, sharded
from compressor.backends.keras.env import import_tensorflow, import_tf_keras
from compressor.backends.keras.feature_distill import with_feature_terms
from compressor.backends.keras.fit_callbacks import (
    epoch_end_callback,
    epoch_phases,
    fine_tuning_optimizer,
    freeze_batch_norm,
)
from compressor.backends.keras.io import output_names, predict
from compressor.backends.training_data import steps_per_epoch, training_inputs
from compressor.backends.training_rules import (CROSS_ENTROPY_ON_LOGITS, MSE, NUMPY_OPS,
                                                PROBE_SAMPLES, ArrayOps, as_logits,
                                                outputs_probabilities, require_teacher, task_loss)
from compressor.backends.training_rules import distillation_loss as kd_loss
from compressor.core.tensors import Arrays, is_named, matched, output_list, rows, take

if TYPE_CHECKING:
    from compressor.core.context import Context
    from compressor.config.steps import DistillConfig, TrainingConfig


def fine_tune(build_model: Callable[[], Any], reference: Any, config: TrainingConfig,
              ctx: Context, description: str, callbacks: Sequence[Any] = (),
              distill: DistillConfig | None = None,
              eligible: Callable[[int], bool] = lambda step: True,
              freeze_bn_after: int | None = None) -> Any:
    """Build the model to train and fit it for `config.epochs` on the training split.

    The loss is training_rules.task_loss's: with labels sparse categorical cross-entropy
    (from logits unless `reference` outputs probabilities), without labels MSE to
    `reference`'s outputs. With `distill` it is `distillation_loss` against `ctx.teacher`'s
    logits.
    Fine-tuning defaults (backends/fine_tuning.py): the rate of every step is lr_at; each
    epoch's loss and val metric go into the step's history; the best epoch among those
    `eligible(optimizer steps so far)` accepts is kept (as in the PyTorch loop); BatchNorm
    statistics are frozen after `freeze_bn_after` epochs (QAT).
    """
    tf_keras = import_tf_keras()
    if config.epochs == 0:
        return build_model()
    if getattr(config, "precision", "fp32") == "bf16":
        ctx.progress.info(f"warning: {description}: precision bf16 is not applied to Keras "
                          "models (tfmot's pruning and fake-quant wrappers train in float32); "
                          "this step trains in float32")
    x, y = training_inputs(ctx, description)
    x = _keyed_by_input(reference, x)
    distill = distill if distill is not None and distill.guides(config) else None
    tf_keras.utils.set_random_seed(ctx.seed)
    read = Outputs(ctx.output_index)
    targets, loss = (_distillation_targets_and_loss(reference, x, y, distill, ctx.teacher, read)
                     if distill is not None else _targets_and_loss(reference, x, y, tf_keras, read))
    steps = steps_per_epoch(ctx, config, description)
    total = steps * config.epochs
    # Model and optimizer in the strategy's scope under TF_CONFIG (mirrored variables).
    model, optimizer = build_in_scope(lambda: (build_model(), fine_tuning_optimizer(config, total)),
                                      ctx.progress)
    # Several outputs: the loss and its targets go to the output the metric reads only.
    names = output_names(model)
    if len(names) > 1:
        chosen = names[read.index]
        loss = {name: (loss if name == chosen else None) for name in names}
        targets = {chosen: targets}
    dataset = sharded(_shuffled_batches(x, targets, config.batch_size, ctx.seed))
    epoch_end = epoch_end_callback(start_history(ctx, description), config, steps,
                                   _val_scorer(reference, ctx, read), eligible)
    trained = with_feature_terms(model, config, ctx.teacher)   # distill feature_pairs, or model
    with ctx.progress.task(description, total) as advance:
        fit_callbacks = [*callbacks, epoch_end, _progress_callback(tf_keras, advance)]
        for first, end, frozen in epoch_phases(config.epochs, freeze_bn_after):
            if frozen:
                freeze_batch_norm(model)
            trained.compile(optimizer=optimizer, loss=loss)   # again after freezing: same state
            trained.fit(dataset, initial_epoch=first, epochs=end, verbose=0,
                        callbacks=fit_callbacks)
            if trained.stop_training:   # early stop
                break
    epoch_end.restore_best()
    return model


def _val_scorer(reference: Any, ctx: Context,
                read: Outputs) -> Callable[[Any], tuple[str, float] | None]:
    """score(model): fine_tuning.val_score of the model's read output on the val split."""
    if ctx.data.val is None:
        return lambda model: None
    x_val = _keyed_by_input(reference, ctx.data.val[0])
    labels, wanted = val_targets(ctx)
    return lambda model: val_score(read.of(model, x_val), labels, wanted)


@dataclass(frozen=True)
class Outputs:
    """Reads the output losses train on (`validate.output`; the first by default)."""

    index: int = 0

    def of(self, model: Any, x: Arrays) -> np.ndarray:
        return output_list(predict(model, x))[self.index]

    def probe(self, model: Any, x: Arrays) -> np.ndarray:
        return self.of(model, take(x, slice(0, PROBE_SAMPLES)))


def _keyed_by_input(model: Any, x: Arrays) -> Arrays:
    """Several inputs keyed by the model's input names (the data may name them otherwise)."""
    if not is_named(x):
        return x
    return dict(zip(model.input_names, matched(x, list(model.input_names))))


def _targets_and_loss(reference: Any, x: Arrays, y: np.ndarray | None, tf_keras: Any,
                      read: Outputs):
    kind = task_loss(y is not None, lambda: outputs_probabilities(read.probe(reference, x)))
    if kind == MSE:
        return read.of(reference, x), tf_keras.losses.MeanSquaredError()
    return y, tf_keras.losses.SparseCategoricalCrossentropy(
        from_logits=kind == CROSS_ENTROPY_ON_LOGITS)


def _tf_ops() -> ArrayOps:
    """training_rules' array operations in TensorFlow; classes on the last axis, one loss per
    sample (Keras averages them)."""
    tf = import_tensorflow()
    return ArrayOps(log=tf.math.log, maximum=tf.maximum, exp=tf.exp,
                    log_softmax=tf.nn.log_softmax,
                    class_sum=lambda x: tf.reduce_sum(x, axis=-1),
                    batch_mean=lambda x: x,
                    mse=lambda a, b: tf.reduce_mean(tf.square(a - b), axis=-1))


def distillation_loss(config: DistillConfig, hard_loss: Callable | None,
                      student_probabilities: bool) -> Callable:
    """training_rules.distillation_loss as a Keras loss(y_true, y_pred), per sample.

    `y_true` is [label, teacher logits...] along the last axis (one tensor, so shuffling keeps
    them aligned), or the teacher logits alone when there are no labels (`hard_loss` None);
    `hard_loss(labels, y_pred)` is a Keras loss function.
    """
    hard = None if hard_loss is None else (lambda y_pred, labels: hard_loss(labels, y_pred))
    rule = kd_loss(_tf_ops(), config, hard, student_probabilities)

    def loss(y_true: Any, y_pred: Any) -> Any:
        if hard_loss is None:
            return rule(y_pred, y_true)
        return rule(y_pred, y_true[..., 1:], y_true[..., 0])

    return loss


def teacher_logits(teacher: Any, x: Arrays, read: Outputs = Outputs()) -> np.ndarray:
    """The frozen teacher's logits for `x`, once, in inference mode (log of probabilities)."""
    require_teacher(teacher)
    logits = read.of(teacher, x).astype(np.float32)
    return as_logits(NUMPY_OPS, logits, outputs_probabilities(read.probe(teacher, x)))


def _distillation_targets_and_loss(reference: Any, x: Arrays, y: np.ndarray | None,
                                   config: DistillConfig, teacher: Any, read: Outputs):
    tf_keras = import_tf_keras()
    soft = teacher_logits(teacher, x, read)
    student_probabilities = outputs_probabilities(read.probe(reference, x))
    if y is None:   # the teacher term alone
        return soft, distillation_loss(config, None, student_probabilities)
    kind = task_loss(True, lambda: student_probabilities)

    def hard_loss(labels: Any, y_pred: Any) -> Any:
        return tf_keras.losses.sparse_categorical_crossentropy(
            labels, y_pred, from_logits=kind == CROSS_ENTROPY_ON_LOGITS)

    labels = np.asarray(y, dtype=np.float32)[..., None]
    return (np.concatenate([labels, soft], axis=-1),
            distillation_loss(config, hard_loss, student_probabilities))


def _shuffled_batches(x: Arrays, targets: Any, batch_size: int, seed: int) -> Any:
    tf = import_tensorflow()
    dataset = tf.data.Dataset.from_tensor_slices((x, targets))
    return dataset.shuffle(rows(x), seed=seed, reshuffle_each_iteration=True).batch(batch_size)


def _progress_callback(tf_keras: Any, advance: Callable[[int], None]) -> Any:
    class ProgressCallback(tf_keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            advance(1)

    return ProgressCallback()

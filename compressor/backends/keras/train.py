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
from compressor.errors import RecipeError
from compressor.tensors import Arrays, is_named, matched, output_list, rows, take

if TYPE_CHECKING:
    from compressor.context import Context
    from compressor.steps import DistillConfig, TrainingConfig

PROBE_SAMPLES = 64   # how many inputs decide whether a model outputs probabilities or logits


def fine_tune(build_model: Callable[[], Any], reference: Any, config: TrainingConfig,
              ctx: Context, description: str, callbacks: Sequence[Any] = (),
              distill: DistillConfig | None = None,
              eligible: Callable[[int], bool] = lambda step: True,
              freeze_bn_after: int | None = None) -> Any:
    """Build the model to train and fit it for `config.epochs` on the training split.

    With labels the loss is sparse categorical cross-entropy (from logits unless `reference`
    outputs probabilities); without labels the model learns `reference`'s outputs (MSE).
    With `distill` the loss is `distillation_loss` against `ctx.teacher`'s logits.
    Fine-tuning defaults (backends/fine_tuning.py): the rate of every step is lr_at; each
    epoch's loss and val metric go into the step's history; the best epoch among those
    `eligible(optimizer steps so far)` accepts is kept (as in the PyTorch loop); BatchNorm
    statistics are frozen after `freeze_bn_after` epochs (QAT).
    """
    tf_keras = import_tf_keras()
    if config.epochs == 0:
        return build_model()
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


def outputs_probabilities(out: np.ndarray) -> bool:
    """True when the model ends in a softmax: outputs in [0, 1] whose rows sum to 1."""
    if out.ndim < 2 or out.shape[-1] < 2:
        return False
    return bool(out.min() >= 0.0 and out.max() <= 1.0
                and np.allclose(out.sum(axis=-1), 1.0, atol=1e-3))


def _targets_and_loss(reference: Any, x: Arrays, y: np.ndarray | None, tf_keras: Any,
                      read: Outputs):
    if y is None:
        return read.of(reference, x), tf_keras.losses.MeanSquaredError()
    from_logits = not outputs_probabilities(read.probe(reference, x))
    return y, tf_keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits)


def distillation_loss(config: DistillConfig, hard_loss: Callable | None,
                      student_probabilities: bool) -> Callable:
    """alpha * T^2 * KL(softmax(t/T) || softmax(s/T)) + (1 - alpha) * hard_loss, per sample.

    `y_true` is [label, teacher logits...] along the last axis (one tensor, so shuffling keeps
    them aligned), or the teacher logits alone when there are no labels; then the loss is the
    teacher term only, as MSE on logits (no labels may mean regression). `loss: mse` swaps
    the KL for MSE on logits.
    """
    tf = import_tensorflow()
    temperature, alpha = config.temperature, config.alpha
    kind = config.loss if hard_loss is not None else "mse"

    def loss(y_true: Any, y_pred: Any) -> Any:
        teacher = y_true[..., 1:] if hard_loss is not None else y_true
        student = tf.math.log(tf.maximum(y_pred, 1e-12)) if student_probabilities else y_pred
        if kind == "kl":
            soft_targets = tf.nn.log_softmax(teacher / temperature)
            soft_student = tf.nn.log_softmax(student / temperature)
            term = temperature ** 2 * tf.reduce_sum(
                tf.exp(soft_targets) * (soft_targets - soft_student), axis=-1)
        else:
            term = tf.reduce_mean(tf.square(student - teacher), axis=-1)
        if hard_loss is None:
            return term
        return alpha * term + (1.0 - alpha) * hard_loss(y_true[..., 0], y_pred)

    return loss


def teacher_logits(teacher: Any, x: Arrays, read: Outputs = Outputs()) -> np.ndarray:
    """The frozen teacher's logits for `x`, once, in inference mode (log of probabilities)."""
    if teacher is None:
        raise RecipeError("distillation needs a teacher model; pass --teacher MODEL "
                          "(or teacher=... in Python)")
    logits = read.of(teacher, x).astype(np.float32)
    if outputs_probabilities(read.probe(teacher, x)):
        return np.log(np.maximum(logits, 1e-12))
    return logits


def _distillation_targets_and_loss(reference: Any, x: Arrays, y: np.ndarray | None,
                                   config: DistillConfig, teacher: Any, read: Outputs):
    tf_keras = import_tf_keras()
    soft = teacher_logits(teacher, x, read)
    student_probabilities = outputs_probabilities(read.probe(reference, x))
    if y is None:
        return soft, distillation_loss(config, None, student_probabilities)

    def hard_loss(labels: Any, y_pred: Any) -> Any:
        return tf_keras.losses.sparse_categorical_crossentropy(
            labels, y_pred, from_logits=not student_probabilities)

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

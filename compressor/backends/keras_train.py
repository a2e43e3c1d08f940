"""The one training loop of the Keras backend: pruning, QAT (and later distillation) use it.

`fine_tune` creates the model to train, the dataset and the optimizer in one place, under
`training_scope(ctx)`, so that a tf.distribute strategy (put in `ctx.extras["keras_strategy"]`)
can wrap all three without touching the passes.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from compressor.backends.keras_env import import_tensorflow, import_tf_keras
from compressor.errors import DataError

if TYPE_CHECKING:
    from compressor.context import Context
    from compressor.registry import TrainingConfig

DEFAULT_LR = 1e-3
PROBE_SAMPLES = 64   # how many inputs decide whether a model outputs probabilities or logits
STRATEGY_KEY = "keras_strategy"


def training_inputs(ctx: Context, purpose: str) -> tuple[np.ndarray, np.ndarray | None]:
    """The training split, or a DataError saying that `purpose` needs one."""
    if ctx.data.train is None or len(ctx.data.train[0]) == 0:
        raise DataError(f"{purpose} needs training data, but {ctx.data.name} has no train split; "
                        "pass data with x_train (and y_train), or set epochs: 0")
    x, y = ctx.data.train
    return np.asarray(x), (None if y is None else np.asarray(y))


def steps_per_epoch(ctx: Context, config: TrainingConfig, purpose: str) -> int:
    x, _ = training_inputs(ctx, purpose)
    return math.ceil(len(x) / config.batch_size)


def training_scope(ctx: Context):
    strategy = ctx.extras.get(STRATEGY_KEY)
    return strategy.scope() if strategy is not None else contextlib.nullcontext()


def fine_tune(build_model: Callable[[], Any], reference: Any, config: TrainingConfig,
              ctx: Context, description: str, callbacks: Sequence[Any] = ()) -> Any:
    """Build the model to train and fit it for `config.epochs` on the training split.

    With labels the loss is sparse categorical cross-entropy (from logits unless `reference`
    outputs probabilities); without labels the model learns `reference`'s outputs (MSE).
    """
    tf_keras = import_tf_keras()
    if config.epochs == 0:
        with training_scope(ctx):
            return build_model()
    x, y = training_inputs(ctx, description)
    tf_keras.utils.set_random_seed(ctx.seed)
    targets, loss = _targets_and_loss(reference, x, y, tf_keras)
    with training_scope(ctx):
        model = build_model()
        dataset = _shuffled_batches(x, targets, config.batch_size, ctx.seed)
        model.compile(optimizer=tf_keras.optimizers.Adam(config.lr or DEFAULT_LR), loss=loss)
    total = steps_per_epoch(ctx, config, description) * config.epochs
    with ctx.progress.task(description, total) as advance:
        model.fit(dataset, epochs=config.epochs, verbose=0,
                  callbacks=[*callbacks, _progress_callback(tf_keras, advance)])
    return model


def outputs_probabilities(model: Any, x: np.ndarray) -> bool:
    """True when the model ends in a softmax: outputs in [0, 1] whose rows sum to 1."""
    out = model(x[:PROBE_SAMPLES], training=False)
    out = np.asarray(out[0] if isinstance(out, (list, tuple)) else out)
    if out.ndim < 2 or out.shape[-1] < 2:
        return False
    return bool(out.min() >= 0.0 and out.max() <= 1.0
                and np.allclose(out.sum(axis=-1), 1.0, atol=1e-3))


def _targets_and_loss(reference: Any, x: np.ndarray, y: np.ndarray | None, tf_keras: Any):
    if y is None:
        targets = np.concatenate([np.asarray(reference(x[i:i + 256], training=False))
                                  for i in range(0, len(x), 256)])
        return targets, tf_keras.losses.MeanSquaredError()
    from_logits = not outputs_probabilities(reference, x)
    return y, tf_keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits)


def _shuffled_batches(x: np.ndarray, targets: np.ndarray, batch_size: int, seed: int) -> Any:
    tf = import_tensorflow()
    dataset = tf.data.Dataset.from_tensor_slices((x, targets))
    return dataset.shuffle(len(x), seed=seed, reshuffle_each_iteration=True).batch(batch_size)


def _progress_callback(tf_keras: Any, advance: Callable[[int], None]) -> Any:
    class ProgressCallback(tf_keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            advance(1)

    return ProgressCallback()

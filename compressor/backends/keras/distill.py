"""Knowledge distillation for Keras: the student trains on a frozen teacher's soft targets.

The KD loss and the keep-zeros rule are framework-neutral (backends/training_rules.py); the
one training loop (keras_train.distillation_loss) applies the loss, which pruning and QAT also
use while a distill step guides them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from compressor.backends.keras.env import import_tf_keras
from compressor.backends.keras.load import clone_keras_model
from compressor.backends.keras.train import fine_tune
from compressor.backends.training_rules import keeps_pruned_zeros

if TYPE_CHECKING:
    from compressor.core.context import Context, ModelState
    from compressor.config.steps import DistillConfig


def distilled_model(state: ModelState, config: DistillConfig, ctx: Context) -> Any:
    """A copy of the model trained `config.epochs` with the KD loss against `ctx.teacher`.

    After a prune step, the pruned kernel weights are re-zeroed after every update, so
    distilling never refills the sparsity the recipe asked for.
    """
    model = state.model
    callbacks = [_keep_zeros_callback()] if keeps_pruned_zeros(state, config) else []
    return fine_tune(lambda: clone_keras_model(model), model, config, ctx,
                     "distilling from the teacher", callbacks=callbacks, distill=config)


def _keep_zeros_callback() -> Any:
    tf_keras = import_tf_keras()

    class KeepZeros(tf_keras.callbacks.Callback):
        """Masks taken when training starts: today's zeros of every kernel stay zero."""

        def on_train_begin(self, logs=None):
            kernels = [w for w in self.model.trainable_weights if len(w.shape) >= 2]
            self.masks = [(w, (w.numpy() != 0).astype(np.float32)) for w in kernels]

        def on_train_batch_end(self, batch, logs=None):
            for weight, mask in self.masks:
                weight.assign(weight * mask)

    return KeepZeros()

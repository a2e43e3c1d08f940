"""The Keras training loop's fine-tuning defaults (backends/fine_tuning.py), read back from the
trained models: the rate of every optimizer step, BatchNorm statistics frozen in QAT, the best
epoch kept, early stop, and pruning's keep-best choosing only epochs at full sparsity.

Budget: a one-conv BatchNorm net trained once (module scope) on 320 digits; 10 steps per epoch."""
from __future__ import annotations

import numpy as np
import pytest

from support import helpers
from support import keras_models as km
from compressor.backends.fine_tuning import lr_at
from compressor.core.context import Data, ModelState
from compressor.tasks.array.data import digits
from compressor.config.steps import PruneConfig, QuantizeConfig

pytest.importorskip("tensorflow_model_optimization")

TRAIN_ROWS = 320   # 10 steps of 32 per epoch


@pytest.fixture(scope="module")
def setup():
    full = digits("NHWC")
    x, y = full.train
    data = Data(train=(x[:TRAIN_ROWS], y[:TRAIN_ROWS]), val=full.val, name="digits")
    return data, km.train(bn_net(), full, epochs=4)


def bn_net():
    """Conv + BatchNorm + ReLU, dense head: ~97% on digits in 4 epochs, cheap to wrap."""
    keras = km.tf_keras()
    keras.utils.set_random_seed(0)
    layers = keras.layers
    inputs = keras.Input((8, 8, 1))
    x = layers.Conv2D(8, 3, padding="same", use_bias=False)(inputs)
    x = layers.ReLU()(layers.BatchNormalization(momentum=0.9)(x))
    return keras.Model(inputs, layers.Dense(10)(layers.Flatten()(x)), name="bn_net")


def ctx(data):
    return helpers.context(data)


def first_batch_norm(model):
    from compressor.backends.keras.fit_callbacks import _leaf_layers

    return next(layer for layer in _leaf_layers(model)
                if type(layer).__name__ == "BatchNormalization")


def recorder(every_batch):
    """A callback calling every_batch(model) after each training step (the optimizer's
    `learning_rate` is then the rate that step used)."""
    from compressor.backends.keras.env import import_tf_keras

    class Record(import_tf_keras().callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            every_batch(self.model)

    return Record()


def qat(setup, config, callbacks=()):
    from compressor.backends.keras.load import clone_keras_model
    from compressor.backends.keras.optimize import _with_fake_quant
    from compressor.backends.keras.train import fine_tune

    data, model = setup
    context = ctx(data)
    trained = fine_tune(lambda: _with_fake_quant(clone_keras_model(model), False), model,
                        config, context, "qat", callbacks=callbacks,
                        freeze_bn_after=config.freeze_bn_after)
    return trained, context.record.histories[-1]


def val_accuracy(model, data):
    return km.accuracy(model.predict(data.val[0], verbose=0), data.val[1])


def test_optimizer_from_config():
    from compressor.backends.keras.fit_callbacks import fine_tuning_optimizer

    adamw = fine_tuning_optimizer(QuantizeConfig(optimizer="adamw"), 20)
    sgd = fine_tuning_optimizer(QuantizeConfig(optimizer="sgd"), 20)
    assert type(adamw).__name__ == "AdamW" and adamw.weight_decay == pytest.approx(1e-4)
    assert type(sgd).__name__ == "SGD" and float(sgd.momentum) == pytest.approx(0.9)
    assert float(sgd.learning_rate) == pytest.approx(lr_at(0, 20, QuantizeConfig()) * 10)


@pytest.mark.slow
def test_qat_rates_history_and_batch_norm_frozen_after_the_first_epoch(setup):
    rates, means = [], []

    def record(model):
        rates.append(float(model.optimizer.learning_rate))
        means.append(first_batch_norm(model).moving_mean.numpy().copy())

    config = QuantizeConfig(epochs=3, keep_best=False)   # freeze_bn_after: 1 by default
    trained, history = qat(setup, config, [recorder(record)])
    np.testing.assert_allclose(rates, [lr_at(step, 30, config) for step in range(30)], rtol=1e-6)
    assert max(rates) == pytest.approx(3e-4)
    # Epoch 1 (steps 0-9) updates the statistics; from epoch 2 (step 10 on) they stay fixed.
    assert len(means) == 30 and not np.allclose(means[0], means[9])
    for mean in [*means[10:], first_batch_norm(trained).moving_mean.numpy()]:
        np.testing.assert_array_equal(mean, means[9])
    assert not first_batch_norm(trained).trainable
    assert [e.epoch for e in history.epochs] == [1, 2, 3] and history.metric == "accuracy"
    assert all(0.9 < e.val_metric <= 1 for e in history.epochs)
    assert history.epochs[0].lr == pytest.approx(lr_at(9, 30, config))


@pytest.mark.slow
def test_keep_best_restores_the_best_epoch_and_early_stop(setup):
    # A from-scratch SGD rate far too high for a trained net: later epochs get worse.
    data, _ = setup
    config = QuantizeConfig(epochs=6, optimizer="sgd", lr=0.05, lr_schedule="constant",
                            early_stop=1, freeze_bn_after=None)
    trained, history = qat(setup, config)
    assert history.stopped_early and len(history.epochs) == history.best_epoch + 1 < 6
    assert history.best_value == max(e.val_metric for e in history.epochs)
    assert history.epochs[-1].val_metric < history.best_value
    assert val_accuracy(trained, data) == pytest.approx(history.best_value)


@pytest.mark.slow
def test_pruning_keeps_an_epoch_at_full_sparsity(setup):
    from compressor.backends.keras.optimize import pruned_model

    data, model = setup
    context = ctx(data)
    # 3 epochs: sparsity ramps over the first two; only epochs 2 and 3 may be kept.
    pruned = pruned_model(ModelState(model), PruneConfig(sparsity=0.5, epochs=3), context)
    history = context.record.histories[-1]
    assert history.step == "pruning to 50%" and len(history.epochs) == 3
    assert history.best_epoch in (2, 3)
    kernels = [w for w in pruned.get_weights() if w.ndim >= 2]
    assert km.zero_fraction(kernels) == pytest.approx(0.5, abs=0.02)


@pytest.mark.slow
def test_no_val_data_keeps_the_last_epoch_and_records_no_metric(setup):
    data, model = setup
    trained, history = qat((Data(train=data.train), model),
                           QuantizeConfig(epochs=1))
    assert history.metric is None and history.best_epoch is None
    assert [e.val_metric for e in history.epochs] == [None]
    assert all(np.isfinite(e.loss) and e.loss > 0 for e in history.epochs)

"""Keras `prune` with `structure: channel` beyond Conv / Dense / BatchNorm: MultiHeadAttention
loses whole heads, LayerNormalization and PReLU pass channels through (sliced per channel),
SeparableConv2D / 1D prune their pointwise outputs and slice their depthwise inputs.

The slicing rules are checked exactly on dead heads / channels (zeroed weights, removed
without fine-tuning); the token encoder goes through a short `channels50` into a TFLite file
whose weights, MACs and accuracy are read back."""
from __future__ import annotations

from support import keras_models as km
import numpy as np
import pytest

import compressor as cz
from compressor.backends import get_backend
from compressor.core.context import ModelState
from compressor.tasks.array.data import digits
from compressor.runtimes import inspect_artifact
from compressor.config.steps import PruneConfig

from support import helpers

PRUNE = "  - pass: prune\n    structure: channel\n    sparsity: 0.50\n    epochs: 1\n    lr: 0.003\n"
CHANNELS50 = "extends: channels50\nname: channels50_test\nsteps:\n" + PRUNE


@pytest.fixture(scope="module")
def tokens():
    return km.token_data()


@pytest.fixture(scope="module")
def encoder(tokens):
    trained = km.train(km.token_encoder(), tokens, epochs=2, lr=1e-2)
    assert km.accuracy(trained.predict(tokens.val[0], verbose=0), tokens.val[1]) >= 0.85
    return trained


def _attention_name(model) -> str:
    return next(layer.name for layer in model.layers
                if type(layer).__name__ == "MultiHeadAttention")


def _exported(model, data, path):
    backend = get_backend("keras")
    return inspect_artifact(backend.export(ModelState(model), "tflite", path,
                                           helpers.context(data, path.parent)))


def _pruned(model, data, tmp_path, **options):
    options = {"sparsity": 0.5, **options}
    ctx = helpers.context(data, tmp_path)
    state = helpers.apply(get_backend("keras"), ModelState(model),
                          PruneConfig(structure="channel", epochs=0, **options),
                          ctx)
    (section,) = ctx.record.sections   # channel_pruning
    return state, section


@pytest.mark.slow
def test_channels50_prunes_the_encoders_heads_and_feed_forward(encoder, tokens, tmp_path):
    recipe = tmp_path / "channels50_test.yaml"
    recipe.write_text(CHANNELS50)
    result = cz.compress(encoder, str(recipe), tokens, out_dir=tmp_path / "out",
                         formats=("tflite",), latency=False, quiet=True)
    art, channels = result.report["artifacts"][0], result.report["channel_pruning"]
    assert channels["attention_heads"] == [
        {"layer": _attention_name(encoder), "before": 2, "after": 1}]
    # The TFLite converter flattens a Dense on a sequence into a [-1, units]
    # FULLY_CONNECTED: the read-back counts its rows (batch x 8 positions), as keras_macs does.
    unpruned = _exported(encoder, tokens, tmp_path / "unpruned.tflite")
    assert unpruned.macs == channels["model_before"]["macs"]
    assert art["macs"] == channels["model_after"]["macs"]
    # read back from the files: 2 -> 1 heads and 64 -> 32 feed-forward units (the residual
    # stream, embedding and head stay whole); measured 0.50x MACs, 0.55x params
    assert art["macs"] <= 0.55 * unpruned.macs, (art["macs"], unpruned.macs)
    assert art["params"] <= 0.6 * unpruned.params, (art["params"], unpruned.params)
    kernels = sorted(w.shape for w in inspect_artifact(result.artifacts["tflite"]).weights
                     if w.is_kernel)
    assert kernels.count((16, 32)) == 3 and (32, 16) in kernels, kernels   # q, k, v; output
    assert kernels.count((32, 32)) == 2 and not any(64 in s for s in kernels), kernels  # FFN
    # the artifact runs in LiteRT with the accuracy the report read back
    x, y = tokens.val
    accuracy = km.accuracy(km.run_tflite(result.artifacts["tflite"], x), y)
    assert accuracy == pytest.approx(art["metric_value"], abs=1e-9)
    # measured: 1.000 after one epoch (0.995 before), drop -0.005; the gate is 1.5 points
    assert art["drop"] <= 0.015 and result.passed, (art["metric_value"], art["drop"])
    # left whole: the FFN output (it feeds the residual `x + ...`) and the classifier head
    reasons = sorted(entry["reason"] for entry in channels["kept_whole"])
    assert len(reasons) == 2 and "a model output" in reasons[0], reasons
    assert "feeds tf.__operators__.add" in reasons[1], reasons
    markdown = (result.out_dir / "report.md").read_text()
    assert "Attention heads removed" in markdown
    assert f"- {_attention_name(encoder)}: 2 -> 1 heads" in markdown


def test_dead_heads_and_feed_forward_units_are_removed_exactly(tokens, tmp_path):
    """Zero head 0 (its query / key / value / output slices) and every other FFN hidden unit:
    removing them at 50% must not change one output."""
    model = km.token_encoder()
    attention = model.get_layer(_attention_name(model))
    weights = attention.get_weights()
    for variable, value in zip(attention.weights, weights):
        part, kind = variable.name.split(":")[0].split("/")[-2:]
        if part == "attention_output":
            if kind == "kernel":
                value[0] = 0.0        # (heads, head_dim, d_model); its bias is per d_model
        elif kind == "kernel":
            value[:, 0] = 0.0         # query / key / value (d_model, heads, head_dim)
        else:
            value[0] = 0.0            # their biases (heads, head_dim)
    attention.set_weights(weights)
    hidden = next(layer for layer in model.layers if layer.get_config().get("units") == 64)
    kernel, bias = hidden.get_weights()
    kernel[:, ::2], bias[::2] = 0.0, 0.0
    hidden.set_weights([kernel, bias])

    state, section = _pruned(model, tokens, tmp_path)
    x = tokens.val[0][:64]
    np.testing.assert_allclose(state.model.predict(x, verbose=0), model.predict(x, verbose=0),
                               rtol=1e-5, atol=1e-5)
    report = section.report({})
    assert report["attention_heads"] == [
        {"layer": attention.name, "before": 2, "after": 1}]
    assert state.model.get_layer(hidden.name).get_config()["units"] == 32
    assert report["model_after"]["params"] < 0.7 * report["model_before"]["params"]


def test_separable_prelu_and_layernorm_are_sliced_exactly(tmp_path):
    """Half of every Conv2D / SeparableConv2D / SeparableConv1D / Dense output zeroed (with
    its bias): PReLU (per position and channel, and shared over positions), the depthwise
    and pointwise kernels and the next layers' input rows must follow exactly. LayerNorm's
    statistics change when channels go, so its output is checked against LayerNorm over the
    kept channels with the kept gamma / beta. The MAC counts agree with the artifact's."""
    data = digits("NHWC")
    model = _separable_net()
    for layer in model.layers:
        weights = layer.get_weights()
        if type(layer).__name__ in ("Conv2D", "SeparableConv2D", "SeparableConv1D", "Dense") \
                and layer.name != "logits":
            weights[-2][..., ::2], weights[-1][::2] = 0.0, 0.0
        elif type(layer).__name__ in ("PReLU", "LayerNormalization"):
            weights = [np.random.default_rng(1).uniform(0.1, 2.0, w.shape) for w in weights]
        layer.set_weights(weights)
    state, section = _pruned(model, data, tmp_path)
    pruned = state.model
    x = data.val[0][:64]
    kept = np.arange(1, 32, 2)

    def before_norm(net):
        keras = km.tf_keras()
        return keras.Model(net.inputs, net.get_layer("norm").input).predict(x, verbose=0)

    np.testing.assert_allclose(before_norm(pruned), before_norm(model)[:, kept], atol=1e-5)
    assert pruned.get_layer("separable_2d").get_config()["filters"] == 16
    assert pruned.get_layer("separable_1d").get_config()["filters"] == 8
    features = before_norm(model)[:, kept]
    gamma, beta = (w[kept] for w in model.get_layer("norm").get_weights())
    epsilon = model.get_layer("norm").epsilon
    normed = (features - features.mean(-1, keepdims=True)) \
        / np.sqrt(features.var(-1, keepdims=True) + epsilon) * gamma + beta
    logits_kernel, logits_bias = model.get_layer("logits").get_weights()
    np.testing.assert_allclose(pruned.predict(x, verbose=0),
                               normed @ logits_kernel[kept] + logits_bias, atol=1e-4)
    # separable MACs (depthwise + pointwise per position) as the TFLite read-back counts them
    assert _exported(pruned, data, tmp_path / "pruned.tflite").macs == \
        section.report({})["model_after"]["macs"]


def test_macs_count_the_attention_projections_as_the_artifact_does(tokens, tmp_path):
    """keras_macs (what target_macs searches on) equals the TFLite read-back before and after
    head pruning, and a MAC budget of 0.8 removes one of four heads."""
    model = _attention_net()
    state, section = _pruned(model, tokens, tmp_path, sparsity=None, target_macs=0.8)
    report = section.report({})
    assert report["attention_heads"] == [{"layer": "attention", "before": 4, "after": 3}]
    assert report["model_after"]["macs"] <= 0.8 * report["model_before"]["macs"]
    assert _exported(model, tokens, tmp_path / "a.tflite").macs == report["model_before"]["macs"]
    assert _exported(state.model, tokens, tmp_path / "b.tflite").macs == \
        report["model_after"]["macs"]


def _separable_net():
    keras = km.tf_keras()
    keras.utils.set_random_seed(0)
    layers = keras.layers
    inputs = keras.Input((8, 8, 1))
    x = layers.Conv2D(16, 3, padding="same")(inputs)
    x = layers.PReLU(shared_axes=[1, 2])(x)                  # alpha (1, 1, 16)
    x = layers.SeparableConv2D(32, 3, padding="same", name="separable_2d")(x)
    x = layers.PReLU()(x)                                     # alpha (8, 8, 32)
    rows = layers.Reshape((8, 8))(inputs)                     # image rows as a sequence
    y = layers.SeparableConv1D(16, 3, name="separable_1d")(rows)
    y = layers.PReLU(shared_axes=[1])(y)
    x = layers.Concatenate()([layers.GlobalAveragePooling2D()(x),
                              layers.GlobalAveragePooling1D()(y)])
    x = layers.LayerNormalization(name="norm")(layers.Dense(32)(x))
    return keras.Model(inputs, layers.Dense(10, name="logits")(x), name="separable_net")


def _attention_net():
    keras = km.tf_keras()
    keras.utils.set_random_seed(0)
    layers = keras.layers
    ids = keras.Input((km.SEQUENCE_LENGTH,), dtype="int32")
    x = layers.Embedding(km.SEQUENCE_VOCAB, 32)(ids)
    x = layers.MultiHeadAttention(4, 8, name="attention")(x, x)
    logits = layers.Dense(2)(layers.GlobalAveragePooling1D()(x))
    return keras.Model(ids, logits, name="attention_net")

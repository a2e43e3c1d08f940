"""int8 quantization-aware training on nets built as keras.applications builds them
(tests/support/keras_applications_like.py: hard-swish as TFOpLambda arithmetic, Rescaling +
Normalization preprocessing, a BatchNormalization after a Concatenate, '/' in layer names).

tfmot alone failed on each of these (AttributeError on the TFOpLambda `x + 3.0` in
quantize_apply, "Rescaling / BatchNormalization is not supported"), and only after the prune
step had run. Now `int8_prune30` runs through and keeps accuracy; a layer QAT really cannot
take (Conv1D has no tfmot config) is refused before any step, in one line, exit 2."""
from __future__ import annotations

import numpy as np
import pytest
from support import keras_applications_like as kal
from support import keras_models as km

import compressor as cz
from compressor.errors import MESSAGE_LIMIT, RecipeError
from compressor.config.recipe import load_recipe

MAX_DROP = 0.03   # 160 val rows (one row is 0.6 points), 1 + 1 epochs of fine-tuning


def _short_int8_prune30():
    recipe = load_recipe("int8_prune30")
    steps = tuple(step.model_copy(update={"epochs": 1}) for step in recipe.steps)
    return recipe.model_copy(update={"steps": steps, "validation": recipe.validation.model_copy(
        update={"max_drop": MAX_DROP})})


@pytest.fixture(scope="module")
def data():
    return kal.quadrant_data()


@pytest.fixture(scope="module")
def model(data):
    trained = kal.trained(data)
    assert km.accuracy(trained.predict(data.val[0], verbose=0), data.val[1]) >= 0.9, \
        "the test model itself must have learned the task"
    return trained


def test_the_qat_copy_computes_the_same(data):
    """`x + 3.0`, `x * (1 / 6)` (TFOpLambda) -> Rescaling(1, 3), Rescaling(1/6, 0); a conv's
    swish / sigmoid -> an Activation layer after it: the same outputs; a model with nothing
    to rewrite is returned as it is."""
    from compressor.backends.keras.qat_rewrite import quantizable_copy

    model = kal.applications_like()
    copy = quantizable_copy(model)
    kinds = [type(layer).__name__ for layer in copy.layers]
    assert "TFOpLambda" not in kinds and kinds.count("Rescaling") == 1 + 2 * 3
    split = {layer.name: layer.get_config()["activation"] for layer in copy.layers
             if type(layer).__name__ == "Activation"}
    assert split == {"block_se_reduce/swish": "swish", "block_se_expand/sigmoid": "sigmoid"}
    assert copy.get_layer("block_se_expand").get_config()["activation"] == "linear"
    scalars = sorted((layer.scale, layer.offset) for layer in copy.layers
                     if type(layer).__name__ == "Rescaling" and layer.name.startswith("tf."))
    assert scalars == [(1.0 / 6.0, 0.0)] * 3 + [(1.0, 3.0)] * 3
    x = data.val[0][:16]
    np.testing.assert_allclose(copy.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-6,
                               atol=1e-6)
    assert quantizable_copy(copy) is copy


@pytest.mark.slow
def test_int8_prune30_runs_on_a_hard_swish_net(model, data, tmp_path):
    # TFLite only: tfmot's QAT model is what failed; the ONNX artifact is its float layers
    # through onnxruntime's quantizer, tested with the post-training recipes below.
    result = cz.compress(model, _short_int8_prune30(), data=data, out_dir=tmp_path / "out",
                         quiet=True, latency=False, formats=("tflite",))
    assert result.exit_code == 0, result.report["failures"]
    assert result.report["quantize"]["mode"] == "qat"
    baseline = result.report["baseline"]["value"]
    for row in result.report["artifacts"]:
        assert baseline - row["metric_value"] <= MAX_DROP, row
        assert row["int8_weight_share"] >= 0.9, row["largest_float_weights"]
        assert row["sparsity"] >= 0.25, row                  # QAT kept the pruned zeros
    from compressor.export.tflite import float_kernel_ops

    tflite = result.artifacts["tflite"].read_bytes()
    assert float_kernel_ops(tflite) == []                     # every conv / dense op is int8
    assert km.accuracy(km.run_tflite(result.artifacts["tflite"], data.val[0]), data.val[1]) \
        == pytest.approx(_row(result, "tflite")["metric_value"])


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["int8", "fp16"])
def test_post_training_recipes_keep_accuracy_on_a_hard_swish_net(recipe, model, data, tmp_path):
    """The same constructs through calibrated int8 and float16, both formats, the recipe's own
    gate (int8: 1 point, fp16: 0.5 point)."""
    result = cz.compress(model, recipe, data=data, out_dir=tmp_path / "out", quiet=True,
                         latency=False)
    assert result.exit_code == 0, result.report["failures"]
    for row in result.report["artifacts"]:
        assert row["drop"] <= load_recipe(recipe).validation.max_drop, row


def _row(result, fmt):
    return next(row for row in result.report["artifacts"] if row["format"] == fmt)


def _conv1d_model():
    keras = km.tf_keras()
    inputs = keras.Input((16, 4))
    x = keras.layers.Conv1D(8, 3, activation="relu", name="conv1d")(inputs)
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, keras.layers.Dense(2)(x))


def test_a_layer_qat_cannot_wrap_is_refused_before_pruning(monkeypatch, tmp_path):
    import compressor.backends.keras.optimize as optimize

    def no_pruning(*args, **kwargs):
        raise AssertionError("the prune step ran before the refusal")

    monkeypatch.setattr(optimize, "pruned_model", no_pruning)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 16, 4)).astype(np.float32), rng.integers(0, 2, 40)
    with pytest.raises(RecipeError) as error:
        cz.compress(_conv1d_model(), "int8_prune30", data=cz.Data(train=(x, y), val=(x, y)),
                    out_dir=tmp_path / "out", quiet=True, latency=False)
    message = str(error.value)
    assert message.startswith("steps.1 (quantize, mode: qat): tfmot's int8 quantization-aware "
                              "training cannot wrap layer conv1d (Conv1D); use quantize mode: "
                              "ptq"), message
    assert error.value.exit_code == 2 and "\n" not in message and len(message) <= MESSAGE_LIMIT
    assert not (tmp_path / "out").exists()

"""int8 of sequence and transformer models (issue 13): the built-in `int8` picks dynamic int8
for models with attention, LayerNorm, embeddings or recurrent layers and says why; the int8
weight-share gate refuses an "int8" artifact whose weights stayed float; a format that cannot
be produced does not lose the others (exit 5)."""
from __future__ import annotations

import json

import numpy as np
import pytest

import compressor as cz
from compressor.core import int8_mode
from compressor.config.recipe import load_recipe
from compressor.runtimes import inspect_artifact, open_runtime
from compressor.runtimes.weights import int8_weight_share
from support.io_models import token_data, torch_lstm_classifier, torch_token_transformer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tokens():
    return token_data()


@pytest.fixture(scope="module")
def lstm(tokens):
    return torch_lstm_classifier(tokens)


def _assert_int8_passed(result, data):
    assert result.exit_code == 0, result.report["failures"]
    assert result.report["quantize"]["mode"] == "dynamic"
    assert "recurrent" in result.report["quantize"]["reason"] or \
        "attention" in result.report["quantize"]["reason"]
    for fmt, path in result.artifacts.items():
        share, _ = int8_weight_share(inspect_artifact(path).weights)
        assert share >= 0.9, (fmt, share)
        # stateless: a row gives the same outputs whatever was run before it; batched rows
        # agree up to dynamic int8's per-batch activation ranges
        runtime = open_runtime(path)
        single = np.concatenate([runtime.predict(data.val[0][i:i + 1]) for i in range(8)])
        backwards = np.concatenate([runtime.predict(data.val[0][i:i + 1])
                                    for i in reversed(range(8))])[::-1]
        np.testing.assert_array_equal(single, backwards)
        batched = runtime.predict(data.val[0][:8])
        assert np.mean(batched.argmax(1) == single.argmax(1)) >= 0.75


def test_torch_lstm_int8_is_dynamic_and_int8(lstm, tokens, tmp_path):
    result = cz.compress(lstm, "int8", data=tokens, out_dir=tmp_path / "out", latency=False,
                         quiet=True)
    _assert_int8_passed(result, tokens)


def test_torch_transformer_int8_is_dynamic_and_int8(tokens, tmp_path):
    model = torch_token_transformer(tokens)
    recipe = load_recipe("int8")   # 150 val rows: one row is 0.0067 of accuracy
    recipe = recipe.model_copy(update={"validation": recipe.validation.model_copy(
        update={"max_drop": 0.03})})
    result = cz.compress(model, recipe, data=tokens, out_dir=tmp_path / "out", latency=False,
                         quiet=True)
    _assert_int8_passed(result, tokens)
    assert "dynamic" in (tmp_path / "out" / "report.md").read_text()


def test_int8_artifact_whose_weights_stay_float_fails_the_gate(lstm, tokens, tmp_path,
                                                               monkeypatch):
    """Static int8 leaves the LSTM op float in onnxruntime: the old check passed it."""
    monkeypatch.setattr("compressor.passes.quantize.post_training_mode",
                        lambda kinds: ("ptq", "forced static for this test"))
    result = cz.compress(lstm, "int8", data=tokens, out_dir=tmp_path / "out", formats=("onnx",),
                         latency=False, quiet=True)
    assert result.exit_code == 3
    failure = " ".join(result.report["failures"])
    assert "int8 weight bytes" in failure and "float32" in failure
    with pytest.raises(cz.AccuracyGateError):
        result.check()


def test_a_format_that_fails_keeps_the_others(cli, tmp_path):
    """A Keras LSTM over variable-length sequences cannot become a TFLite (it must be
    unrolled); the ONNX file is still written, validated and reported: exit 5."""
    from compressor.backends.keras.env import import_tf_keras

    keras = import_tf_keras()
    keras.utils.set_random_seed(0)
    ids = keras.Input((None,), dtype="int32")
    hidden = keras.layers.LSTM(8)(keras.layers.Embedding(20, 8)(ids))
    model = keras.Model(ids, keras.layers.Dense(2)(hidden))
    model.save(tmp_path / "lstm.keras")
    data = token_data(rows=120)
    np.savez(tmp_path / "tokens.npz", x_train=data.train[0].astype(np.int32),
             y_train=data.train[1], x_val=data.val[0].astype(np.int32), y_val=data.val[1])
    (tmp_path / "fp32.yaml").write_text("name: fp32\nsteps: []\nvalidate: {metric: fidelity}\n")
    done = cli("--recipe", str(tmp_path / "fp32.yaml"), str(tmp_path / "lstm.keras"),
               "--data", str(tmp_path / "tokens.npz"), "--out", str(tmp_path / "out"))
    assert done.returncode == 5, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "tflite" in errors[0]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [row["format"] for row in report["artifacts"]] == ["onnx"]
    failed = report["failed_formats"][0]
    assert failed["format"] == "tflite" and len(failed["error"]) <= 300
    # this refusal comes before the converter runs; a converter failure's log is kept in --out
    assert failed["logs"] is None or any((tmp_path / "out" / "logs").iterdir())


def test_mode_rule():
    assert int8_mode.post_training_mode(frozenset())[0] == "ptq"
    assert int8_mode.layer_kinds(["Conv2d", "BatchNorm2d", "Linear"]) == frozenset()
    assert int8_mode.layer_kinds(["BertSelfAttention", "LayerNorm"]) == {"attention", "layernorm"}
    assert int8_mode.post_training_mode(frozenset({"recurrent"}))[0] == "dynamic"


def test_torch_lstm_fp16_in_both_formats(lstm, tokens, tmp_path):
    result = cz.compress(lstm, "fp16", data=tokens, out_dir=tmp_path / "out", latency=False,
                         quiet=True)
    assert result.exit_code == 0, result.report["failures"]
    assert sorted(result.artifacts) == ["onnx", "tflite"]
    for row in result.report["artifacts"]:
        assert row["weight_dtypes"].get("float16", 0) >= 0.9, row["weight_dtypes"]

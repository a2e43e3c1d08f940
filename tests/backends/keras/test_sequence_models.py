"""Keras sequence and transformer models: Embedding+LSTM, Embedding+GRU and a transformer
encoder (MultiHeadAttention, LayerNormalization, exact GELU, int32 ids) through the built-in
`fp16` recipe in both formats and the `int8` recipe as TFLite, each run once per model for
the module. Every artifact must be stateless: rows fed one at a time, in another order, or as
one batch give the same outputs (a fused TFLite LSTM keeps its state between calls)."""
from __future__ import annotations

from pathlib import Path

from support import keras_models as km
import numpy as np
import pytest

import compressor as cz
from compressor.config.recipe import load_recipe
from compressor.errors import MESSAGE_LIMIT, BackendUnavailableError

pytestmark = pytest.mark.slow
MODELS = {"lstm": lambda: km.token_rnn("LSTM"), "gru": lambda: km.token_rnn("GRU"),
          "encoder": km.token_encoder}
ROWS = 24   # rows fed in the statelessness checks
# int8 share of weight elements in the int8 TFLite. An unrolled GRU's FULLY_CONNECTED ops get
# one int32 bias per time step (the bias scale follows each step's hidden-state scale): at this
# toy size (3 x 32 units, 8 steps) that is ~16% of the elements. LSTM adds its bias in an
# int8 ADD instead.
@pytest.fixture(scope="module")
def data() -> cz.Data:
    return km.token_data()


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request, data):
    trained = km.train(MODELS[request.param](), data, epochs=2, lr=1e-2)
    assert km.accuracy(trained.predict(data.val[0], verbose=0), data.val[1]) >= 0.85, \
        "the test model itself must have learned the task"
    return trained


def _compress(model, recipe: str, data, folder: Path, **options) -> cz.Result:
    return cz.compress(model, recipe, data=data, out_dir=folder, quiet=True, latency=False,
                       **options)


@pytest.fixture(scope="module")
def fp16(model, data, tmp_path_factory):
    return _compress(model, "fp16", data, tmp_path_factory.mktemp("fp16"))


@pytest.fixture(scope="module")
def int8(model, data, tmp_path_factory):
    # the built-in int8 with a 3-point gate: 2-epoch toy models scored on 200 val rows (one
    # row is half a point); the dynamic int8 GRU's ONNX lands 2.5 points down
    recipe = load_recipe("int8")
    recipe = recipe.model_copy(update={"validation": recipe.validation.model_copy(
        update={"max_drop": 0.03})})
    return _compress(model, recipe, data, tmp_path_factory.mktemp("int8"))


def _artifacts(result) -> dict[str, dict]:
    return {entry["format"]: entry for entry in result.report["artifacts"]}


def test_fp16_passes_in_both_formats(fp16):
    assert fp16.exit_code == 0 and fp16.passed
    artifacts = _artifacts(fp16)
    assert sorted(artifacts) == ["onnx", "tflite"]
    for entry in artifacts.values():
        assert entry["metric_value"] >= 0.85
        assert entry["weight_dtypes"].get("float16", 0) >= 0.9


def test_onnx_has_only_standard_ops(model, fp16):
    """Exact GELU's Erfc becomes 1 - Erf; no TensorFlow / TFLite op is left in the file."""
    import onnx

    graph = onnx.load(str(fp16.artifacts["onnx"])).graph
    ops = {node.op_type for node in graph.node}
    assert not {op for op in ops if op.startswith("TFL_") or op == "Erfc"}
    assert {node.domain for node in graph.node} <= {"", "ai.onnx"}
    if model.name == "token_encoder":
        assert "Erf" in ops


def test_int8_passes_in_both_formats(model, int8):
    """The built-in int8 picks dynamic int8 for these models (embeddings, recurrent layers,
    attention) and the file holds >= 90% int8 weight bytes, embedding tables included."""
    assert int8.exit_code == 0 and int8.passed, int8.report["failures"]
    assert int8.report["quantize"]["mode"] == "dynamic"
    artifacts = _artifacts(int8)
    assert sorted(artifacts) == ["onnx", "tflite"]
    for entry in artifacts.values():
        assert entry["metric_value"] >= 0.85
        assert entry["int8_weight_share"] >= 0.9, entry["largest_float_weights"]


def test_artifacts_are_stateless(fp16, int8, data):
    rows = data.val[0][:ROWS]
    order = np.random.default_rng(1).permutation(ROWS)
    for path in [*fp16.artifacts.values(), *int8.artifacts.values()]:
        run = _tflite_runner(path) if Path(path).suffix == ".tflite" else _onnx_runner(path)
        batched = run(rows)
        one_by_one = np.concatenate([run(row[None]) for row in rows])
        shuffled = np.empty_like(batched)
        for index in order:
            shuffled[index] = run(rows[index][None])[0]
        # a row gives the same outputs whatever ran before it (no state between calls)
        np.testing.assert_allclose(shuffled, one_by_one, atol=1e-6, err_msg=str(path))
        if path in int8.artifacts.values() and Path(path).suffix == ".onnx":
            # dynamic int8 quantizes activations per batch: batches agree up to that rounding
            assert np.mean(batched.argmax(1) == one_by_one.argmax(1)) >= 0.9, path
        else:
            np.testing.assert_allclose(one_by_one, batched, atol=1e-4, err_msg=str(path))


def _tflite_runner(path):
    """Calls to ONE interpreter, as an app makes them: state kept between calls would show."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    inp, out = interpreter.get_input_details()[0], interpreter.get_output_details()[0]

    def run(x):
        interpreter.resize_tensor_input(inp["index"], x.shape)
        interpreter.allocate_tensors()
        interpreter.set_tensor(inp["index"], x.astype(inp["dtype"]))
        interpreter.invoke()
        return interpreter.get_tensor(out["index"]).astype(np.float32)

    return run


def _onnx_runner(path):
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda x: session.run(None, {name: x})[0].astype(np.float32)


def test_variable_length_sequences_name_the_fix():
    """TFLite needs the recurrent loop unrolled, over a fixed length."""
    from compressor.backends.keras.recurrent import unrolled_for_tflite

    with pytest.raises(BackendUnavailableError) as error:
        unrolled_for_tflite(km.token_rnn("LSTM", length=None))
    message = str(error.value)
    assert "'lstm" in message and "fixed-length input" in message and "keras.Input((16,))" in message
    assert "\n" not in message and len(message) <= MESSAGE_LIMIT


def test_converter_failure_is_one_line_with_the_full_text_in_the_log(tmp_path):
    """An op TFLite has no kernel for (SVD): one line naming the op and the log file."""
    from support import helpers

    from compressor.backends.keras import KerasBackend
    from compressor.core.context import ModelState

    keras, tf = km.tf_keras(), __import__("tensorflow")
    matrices = keras.Input((4, 4))
    singular = keras.layers.Lambda(lambda x: tf.linalg.svd(x, compute_uv=False))(matrices)
    model = keras.Model(matrices, keras.layers.Dense(2)(singular))
    ctx = helpers.context(workdir=tmp_path / "work")
    with pytest.raises(BackendUnavailableError) as error:
        KerasBackend().export(ModelState(model=model), "tflite", tmp_path / "m.tflite", ctx)
    message = str(error.value)
    log = tmp_path / "work" / "logs" / "tflite-convert.log"
    assert "\n" not in message and len(message) <= MESSAGE_LIMIT, message
    assert message.startswith("TFLite float32 conversion failed: ") and "Svd" in message
    assert str(log) in message and len(log.read_text()) > len(message)

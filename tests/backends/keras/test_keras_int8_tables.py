"""Embedding tables in the Keras int8 TFLite files (export/tflite_tables.py).

ai-edge-quantizer's dynamic / weight-only modes quantize GATHER tables only in static int8,
so an Embedding + LSTM / BiGRU text model's TFLite kept its table float32: 30-40% int8
weights, failing the >= 90% gate. The table is now int8 with one scale per row, looked up by
EMBEDDING_LOOKUP (rows gathered, then scaled)."""
from __future__ import annotations

import numpy as np
import pytest
from support import keras_models as km

import compressor as cz
from compressor.core.context import Data
from compressor.config.recipe import load_recipe

VOCAB, LENGTH, WIDTH = 300, 8, 16


def _token_data(train: int = 1000, val: int = 200, seed: int = 0) -> Data:
    """Ids in [1, VOCAB): is the sequence mostly low ids (< VOCAB / 2)? Learnt through the
    table itself, which is most of the model's weights."""
    rng = np.random.default_rng(seed)
    x = rng.integers(1, VOCAB, (train + val, LENGTH)).astype(np.int32)
    y = ((x < VOCAB // 2).sum(1) > LENGTH // 2).astype(np.int64)
    return Data(train=(x[:train], y[:train]), val=(x[train:], y[train:]))


def _lstm_text_model():
    """Embedding -> LSTM -> logits (the issue's BiGRU model has the same table lookup; the
    LSTM trains faster)."""
    keras = km.tf_keras()
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((LENGTH,), dtype="int32"),
                             keras.layers.Embedding(VOCAB, WIDTH),
                             keras.layers.LSTM(16), keras.layers.Dense(2)], name="text_lstm")


@pytest.fixture(scope="module")
def data():
    return _token_data()


@pytest.mark.slow
def test_int8_text_model_tflite_stores_its_table_int8_per_row(data, tmp_path):
    model = km.train(_lstm_text_model(), data, epochs=4, lr=1e-2)
    assert km.accuracy(model.predict(data.val[0], verbose=0), data.val[1]) >= 0.85
    recipe = load_recipe("int8")
    recipe = recipe.model_copy(update={"validation": recipe.validation.model_copy(
        update={"max_drop": 0.03})})   # 200 val rows, 4 epochs
    result = cz.compress(model, recipe, data=data, out_dir=tmp_path / "out", quiet=True,
                         latency=False, formats=("tflite",))
    assert result.exit_code == 0, result.report["failures"]
    row = result.report["artifacts"][0]
    assert row["int8_weight_share"] >= 0.9, row["largest_float_weights"]
    table, ops = _lookup_table(result.artifacts["tflite"])
    assert "GATHER" not in ops and ops.count("EMBEDDING_LOOKUP") == 1
    assert table["dtype"] == np.int8 and table["shape"].tolist() == [VOCAB, WIDTH]
    scales = table["quantization_parameters"]["scales"]
    assert len(scales) == VOCAB and table["quantization_parameters"]["quantized_dimension"] == 0
    float_table = model.layers[0].get_weights()[0]
    np.testing.assert_allclose(scales, np.abs(float_table).max(axis=1) / 127, rtol=1e-6)


def _lookup_table(path):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    interpreter = Interpreter(model_path=str(path), experimental_op_resolver_type=(
        OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES))
    details = {t["index"]: t for t in interpreter.get_tensor_details()}
    ops = interpreter._get_ops_details()
    lookup = next(op for op in ops if op["op_name"] == "EMBEDDING_LOOKUP")
    return details[lookup["inputs"][1]], [op["op_name"] for op in ops]


def test_tables_become_int8_with_the_same_outputs(tmp_path):
    """A lookup on a dynamic batch, and a [T, D] table added to the activations (a folded
    position embedding): int8 per row, outputs within the rounding of the rows' scales."""
    import tensorflow as tf

    from compressor.export.tflite_tables import int8_tables

    keras = km.tf_keras()
    keras.utils.set_random_seed(0)

    class AddPositions(keras.layers.Layer):
        def build(self, shape):
            self.table = self.add_weight("table", (LENGTH, 256), initializer="random_normal")

        def call(self, x):
            return x + self.table

    ids = keras.Input((LENGTH,), dtype="int32")
    x = AddPositions()(keras.layers.Embedding(VOCAB, 256)(ids))
    model = keras.Model(ids, keras.layers.GlobalAveragePooling1D()(x))
    content = tf.lite.TFLiteConverter.from_keras_model(model).convert()
    quantized = int8_tables(content)
    assert len(quantized) < 0.35 * len(content)
    (tmp_path / "m.tflite").write_bytes(quantized)
    _, ops = _lookup_table(tmp_path / "m.tflite")
    assert ops[0] == "DEQUANTIZE" and "GATHER" not in ops
    rows = np.random.default_rng(0).integers(0, VOCAB, (5, LENGTH)).astype(np.int32)
    expected = model.predict(rows, verbose=0)
    got = km.run_tflite(tmp_path / "m.tflite", rows)
    table_steps = np.abs(model.get_weights()[0]).max() / 127 + np.abs(model.get_weights()[1]).max() / 127
    assert np.abs(got - expected).max() <= table_steps / 2
    assert int8_tables(quantized) == quantized    # nothing float left to store int8

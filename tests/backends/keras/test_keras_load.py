"""What only the Keras backend has: the model formats it loads (.keras, .h5, SavedModel,
Keras 3 files rebuilt in tf_keras), what it refuses, QAT models saved as .h5, softmax heads.

The backend behaviour shared with PyTorch is tested once for both in test_backend_*.py.
"""
from __future__ import annotations

from pathlib import Path

from support import helpers
from support import keras_models as km
import numpy as np
import pytest

from compressor.backends.keras import KerasBackend
from compressor.core.context import Data, ModelState
from compressor.tasks.array.data import digits
from compressor.errors import ModelLoadError
from compressor.config.steps import PruneConfig
from compressor.config.steps import QuantizeConfig

slow = pytest.mark.slow
pytestmark = pytest.mark.filterwarnings("ignore:You are saving your model as an HDF5 file")


@pytest.fixture(scope="module")
def data() -> Data:
    return digits("NHWC")


@pytest.fixture(scope="module")
def backend() -> KerasBackend:
    return KerasBackend()


@pytest.fixture(scope="module")
def model():
    """An untrained digits CNN: loading and saving do not need a good model."""
    return km.digits_cnn()


# --- input errors (fast: no TensorFlow needed) ---------------------------------------------

@pytest.mark.parametrize("name, content, expected", [
    ("missing.keras", None, "does not exist"),
    ("broken.keras", b"PK\x03\x04 not really a zip", "not a valid .keras archive"),
    ("broken.h5", b"\x89HDF\r\n\x1a\n truncated", "not a readable HDF5 file"),
    ("model.pkl", b"\x80\x04", "unsupported Keras model format"),
])
def test_unreadable_model_files_raise_model_load_error(tmp_path, backend, name, content,
                                                       expected):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ModelLoadError, match=expected) as error:
        backend.load(path)
    assert "\n" not in str(error.value)


def test_folder_that_is_not_a_saved_model_is_refused(tmp_path, backend):
    with pytest.raises(ModelLoadError, match="not a SavedModel"):
        backend.load(tmp_path)


# --- describing and loading never touch the caller's model or file --------------------------

@slow
def test_describe_needs_no_example(backend, model):
    info = backend.describe(model)   # a Keras model declares its input
    assert (info.input_shape, info.input_dtype, info.output_shape) == \
        ((None, 8, 8, 1), "float32", (None, 10))
    assert info.params == model.count_params()


def _file_states(path: Path) -> dict[str, tuple[bytes, int]]:
    files = sorted(path.rglob("*")) if path.is_dir() else [path]
    return {str(f): (f.read_bytes(), f.stat().st_mtime_ns) for f in files if f.is_file()}


@slow
@pytest.mark.parametrize("name", ["model.keras", "model.h5", "saved_model_dir"])
def test_loading_and_pruning_leave_the_file_untouched(backend, model, data, tmp_path, name):
    path = tmp_path / name
    model.save(path)
    before = _file_states(path)
    loaded = backend.load(path)
    np.testing.assert_allclose(backend.predict(loaded, data.val[0][:32]),
                               backend.predict(model, data.val[0][:32]), atol=1e-6)
    helpers.apply(backend, ModelState(model=loaded), PruneConfig(sparsity=0.5, epochs=0),
                  helpers.context(data, tmp_path / "work"))
    assert _file_states(path) == before


@slow
def test_a_qat_model_saves_and_loads_back(backend, model, data, tmp_path):
    small = Data(train=(data.train[0][:64], data.train[1][:64]), val=data.val)
    state = helpers.apply(backend, ModelState(model=backend.load(model)),
                          QuantizeConfig(mode="qat", epochs=1),
                          helpers.context(small, tmp_path / "work"))
    path = tmp_path / "qat.h5"    # tf_keras cannot reload QAT wrappers from .keras
    state.model.save(path, include_optimizer=False)
    np.testing.assert_allclose(backend.predict(backend.load(path), data.val[0][:32]),
                               backend.predict(state.model, data.val[0][:32]), atol=1e-6)


@slow
def test_subclassed_models_are_refused(backend):
    keras = km.tf_keras()

    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(3)

        def call(self, inputs):
            return self.dense(inputs)

    model = Subclassed()
    model(np.zeros((1, 4), np.float32))
    with pytest.raises(ModelLoadError, match="Functional or Sequential"):
        backend.load(model)


@slow
def test_truncated_keras_file_raises_model_load_error(backend, model, tmp_path):
    path = tmp_path / "model.keras"
    model.save(path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match="model.keras"):
        backend.load(path)


@slow
def test_lambda_layers_need_trust_pickle(backend, tmp_path):
    keras = km.tf_keras()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Lambda(lambda t: t * 2.0)])
    path = tmp_path / "lambda.h5"
    model.save(path)
    with pytest.raises(ModelLoadError, match="--trust-pickle"):
        backend.load(path)
    loaded = backend.load(path, trust_pickle=True)
    assert [type(layer).__name__ for layer in loaded.layers] == \
        [type(layer).__name__ for layer in model.layers] == ["Lambda"]
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_allclose(backend.predict(loaded, x), x * 2.0)   # the pickled function ran


@slow
def test_keras3_file_is_rebuilt_in_tf_keras(backend, tmp_path):
    keras3 = pytest.importorskip("keras")
    if not keras3.__version__.startswith("3."):
        pytest.skip("Keras 3 is not installed")
    inputs = keras3.Input((8, 8, 1))
    x = keras3.layers.Conv2D(8, 3, activation="relu")(inputs)
    x = keras3.layers.BatchNormalization()(x)
    x = keras3.layers.Add()([x, keras3.layers.Conv2D(8, 3, padding="same")(x)])
    outputs = keras3.layers.Dense(10)(keras3.layers.GlobalAveragePooling2D()(x))
    original = keras3.Model(inputs, outputs)
    path = tmp_path / "keras3.keras"
    original.save(path)
    rebuilt = backend.load(path)
    assert type(rebuilt).__module__.startswith("tf_keras")
    x_test = np.random.default_rng(0).random((4, 8, 8, 1), dtype=np.float32)
    np.testing.assert_allclose(backend.predict(rebuilt, x_test),
                               np.asarray(original(x_test)), atol=1e-5)

    blocked = keras3.Sequential([keras3.Input((8,)), keras3.layers.RMSNormalization(),
                                 keras3.layers.Dense(2)])
    blocked_path = tmp_path / "keras3_only.keras"
    blocked.save(blocked_path)
    with pytest.raises(ModelLoadError, match="RMSNormalization"):
        backend.load(blocked_path)


@slow
def test_softmax_heads_are_detected():
    from compressor.backends.keras.train import Outputs, outputs_probabilities

    x = np.random.default_rng(0).random((16, 8, 8, 1), dtype=np.float32)
    assert outputs_probabilities(Outputs().probe(km.digits_cnn(softmax=True), x))
    assert not outputs_probabilities(Outputs().probe(km.digits_cnn(softmax=False), x))

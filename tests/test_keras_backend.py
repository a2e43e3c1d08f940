"""The Keras backend and the Keras export routes, checked on real artifacts in real runtimes.

A small CNN is trained on the built-in digits split inside the tests; every number asserted
here is read back from the exported file or measured by running it in LiteRT / onnxruntime.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import keras_models as km
import numpy as np
import pytest

from compressor.backends.keras_backend import KerasBackend
from compressor.context import Data, ModelState
from compressor.data import digits
from compressor.errors import (
    BackendUnavailableError,
    DataError,
    ModelLoadError,
    RecipeError,
)
from compressor.passes.precision import PrecisionConfig
from compressor.passes.prune import PruneConfig
from compressor.passes.quantize import QuantizeConfig

slow = pytest.mark.slow
pytestmark = pytest.mark.filterwarnings("ignore:You are saving your model as an HDF5 file")


@pytest.fixture(scope="module")
def data() -> Data:
    return digits("NHWC")


@pytest.fixture(scope="module")
def backend() -> KerasBackend:
    return KerasBackend()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("keras")


@pytest.fixture(scope="module")
def ctx(data, workdir):
    return km.keras_context(data, workdir / "work")


@pytest.fixture(scope="module")
def float_model(data):
    return km.train(km.digits_cnn(), data)


@pytest.fixture(scope="module")
def float_accuracy(backend, float_model, data) -> float:
    accuracy = km.accuracy(backend.predict(float_model, data.val[0]), data.val[1])
    assert accuracy >= 0.95, "the test model itself must be good for drops to mean anything"
    return accuracy


def _export_both(backend, state, ctx, folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    return {fmt: backend.export(state, fmt, folder / f"model.{fmt}", ctx)
            for fmt in ("tflite", "onnx")}


@pytest.fixture(scope="module")
def fp32(backend, float_model, ctx, workdir):
    state = ModelState(model=backend.load(float_model))
    return _export_both(backend, state, ctx, workdir / "fp32")


@pytest.fixture(scope="module")
def int8_prune30_state(backend, float_model, ctx) -> ModelState:
    state = ModelState(model=backend.load(float_model))
    state = backend.prune(state, PruneConfig(sparsity=0.30, schedule="polynomial", epochs=2), ctx)
    return backend.quantize_qat(state, QuantizeConfig(mode="qat", epochs=2,
                                                      preserve_sparsity=True), ctx)


@pytest.fixture(scope="module")
def int8_prune30(backend, int8_prune30_state, ctx, workdir):
    return _export_both(backend, int8_prune30_state, ctx, workdir / "int8_prune30")


@pytest.fixture(scope="module")
def ptq(backend, float_model, ctx, workdir):
    state = backend.quantize_ptq(ModelState(model=backend.load(float_model)),
                                 QuantizeConfig(mode="ptq", calibration_samples=256), ctx)
    return _export_both(backend, state, ctx, workdir / "ptq")


@pytest.fixture(scope="module")
def fp16(backend, float_model, ctx, workdir):
    state = backend.to_precision(ModelState(model=backend.load(float_model)),
                                 PrecisionConfig(dtype="float16"), ctx)
    return _export_both(backend, state, ctx, workdir / "fp16")


def _accuracy(path: Path, data: Data) -> float:
    run = km.run_tflite if path.suffix == ".tflite" else km.run_onnx
    return km.accuracy(run(path, data.val[0]), data.val[1])


def _kernels(path: Path) -> list[np.ndarray]:
    read = km.tflite_kernel_weights if path.suffix == ".tflite" else km.onnx_kernel_weights
    kernels = read(path)
    assert len(kernels) == 4, f"expected the 2 conv + 2 dense kernels in {path.name}"
    return kernels


# --- lean imports and input errors (fast: no TensorFlow needed) --------------------------

def test_keras_backend_and_exporters_import_no_framework():
    code = ("import sys, compressor, compressor.backends.keras_backend, compressor.export, "
            "compressor.export.tflite, compressor.export.onnx, compressor.export.quiet\n"
            "heavy = {'tensorflow', 'tf_keras', 'tensorflow_model_optimization', 'tf2onnx', "
            "'onnx', 'onnxruntime', 'ai_edge_litert', 'keras'}\n"
            "print(sorted(heavy & set(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"


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


def test_unsupported_requests_raise_typed_errors(backend, tmp_path):
    ctx = km.keras_context(Data(), tmp_path)
    state = ModelState(model=object())
    with pytest.raises(BackendUnavailableError, match="use dtype: float16"):
        backend.to_precision(state, PrecisionConfig(dtype="bfloat16"), ctx)
    fp16_state = state.replace(precision=PrecisionConfig())
    with pytest.raises(RecipeError, match="either int8 or float16"):
        backend.quantize_ptq(fp16_state, QuantizeConfig(mode="ptq"), ctx)


# --- loading never touches the caller's model or file -------------------------------------

@slow
def test_describe(backend, float_model):
    info = backend.describe(float_model)
    assert info.input_shape == (None, 8, 8, 1)
    assert info.input_dtype == "float32"
    assert info.output_shape == (None, 10)
    assert info.params == float_model.count_params()
    assert info.size_bytes == 4 * info.params


@slow
def test_pruning_a_loaded_model_leaves_the_callers_model_alone(backend, float_model, data,
                                                               tmp_path):
    before = [w.copy() for w in float_model.get_weights()]
    ctx = km.keras_context(data, tmp_path)
    state = backend.prune(ModelState(model=backend.load(float_model)),
                          PruneConfig(sparsity=0.5, epochs=0), ctx)
    assert state.model is not float_model
    assert all(np.array_equal(a, b) for a, b in zip(before, float_model.get_weights()))
    assert km.zero_fraction([float_model.layers[0].kernel.numpy()]) == 0.0


def _file_states(path: Path) -> dict[str, tuple[bytes, int]]:
    files = sorted(path.rglob("*")) if path.is_dir() else [path]
    return {str(f): (f.read_bytes(), f.stat().st_mtime_ns) for f in files if f.is_file()}


@slow
@pytest.mark.parametrize("name", ["model.keras", "model.h5", "saved_model_dir"])
def test_loading_and_pruning_leave_the_file_untouched(backend, float_model, data, tmp_path,
                                                      name):
    path = tmp_path / name
    float_model.save(path)
    before = _file_states(path)
    loaded = backend.load(path)
    np.testing.assert_allclose(backend.predict(loaded, data.val[0][:32]),
                               backend.predict(float_model, data.val[0][:32]), atol=1e-6)
    backend.prune(ModelState(model=loaded), PruneConfig(sparsity=0.5, epochs=0),
                  km.keras_context(data, tmp_path / "work"))
    assert _file_states(path) == before


@slow
def test_a_qat_model_saves_and_loads_back(backend, int8_prune30_state, data, tmp_path):
    path = backend.save(int8_prune30_state.model, tmp_path / "qat.keras")
    assert path.suffix == ".h5"   # tf_keras cannot reload QAT wrappers from .keras
    np.testing.assert_allclose(backend.predict(backend.load(path), data.val[0][:32]),
                               backend.predict(int8_prune30_state.model, data.val[0][:32]),
                               atol=1e-6)


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
def test_truncated_keras_file_raises_model_load_error(backend, float_model, tmp_path):
    path = tmp_path / "model.keras"
    float_model.save(path)
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
    assert backend.load(path, trust_pickle=True) is not None


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


# --- pruning and training ------------------------------------------------------------------

@slow
def test_one_shot_pruning_zeroes_each_kernel(backend, float_model, data, tmp_path):
    state = backend.prune(ModelState(model=backend.load(float_model)),
                          PruneConfig(sparsity=0.4, epochs=0), km.keras_context(data, tmp_path))
    assert state.sparsity == 0.4
    kernels = [w for w in state.model.get_weights() if w.ndim >= 2]
    for kernel in kernels:
        assert km.zero_fraction([kernel]) == pytest.approx(0.4, abs=0.01)


@slow
def test_fine_tuning_needs_training_data(backend, float_model, tmp_path, data):
    ctx = km.keras_context(Data(val=data.val), tmp_path)
    with pytest.raises(DataError, match="train split"):
        backend.prune(ModelState(model=float_model), PruneConfig(sparsity=0.3, epochs=1), ctx)


@slow
def test_softmax_heads_are_detected():
    from compressor.backends.keras_train import outputs_probabilities

    x = np.random.default_rng(0).random((16, 8, 8, 1), dtype=np.float32)
    assert outputs_probabilities(km.digits_cnn(softmax=True), x)
    assert not outputs_probabilities(km.digits_cnn(softmax=False), x)


@slow
def test_pruning_is_deterministic_under_the_seed(backend, float_model, data, tmp_path):
    small = Data(train=(data.train[0][:128], data.train[1][:128]), val=data.val)
    config = PruneConfig(sparsity=0.3, schedule="constant", epochs=1)
    runs = [backend.prune(ModelState(model=backend.load(float_model)), config,
                          km.keras_context(small, tmp_path / str(i), seed=7)).model
            for i in range(2)]
    for a, b in zip(runs[0].get_weights(), runs[1].get_weights()):
        np.testing.assert_array_equal(a, b)


# --- int8_prune30: prune 30% + prune-preserving QAT ----------------------------------------

@slow
def test_int8_prune30_keeps_accuracy_in_both_runtimes(int8_prune30, float_accuracy, data):
    for path in int8_prune30.values():
        assert float_accuracy - _accuracy(path, data) <= 0.01, path.name


@slow
def test_int8_onnx_predicts_like_the_int8_tflite(int8_prune30, data):
    tflite_out = km.run_tflite(int8_prune30["tflite"], data.val[0])
    onnx_out = km.run_onnx(int8_prune30["onnx"], data.val[0])
    assert np.mean(tflite_out.argmax(1) == onnx_out.argmax(1)) >= 0.99


@slow
def test_int8_prune30_is_small_sparse_and_int8(int8_prune30, fp32):
    assert int8_prune30["tflite"].stat().st_size <= 0.30 * fp32["tflite"].stat().st_size
    for path in int8_prune30.values():
        kernels = _kernels(path)
        assert {k.dtype.name for k in kernels} == {"int8"}, path.name
        assert km.zero_fraction(kernels) >= 0.28, path.name


@slow
def test_qat_with_int8_io(backend, int8_prune30_state, ctx, tmp_path, float_accuracy, data):
    state = int8_prune30_state.replace(
        quantize=int8_prune30_state.quantize.model_copy(update={"io_dtype": "int8"}))
    path = backend.export(state, "tflite", tmp_path / "io8.tflite", ctx)
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    assert interpreter.get_input_details()[0]["dtype"] == np.int8
    assert interpreter.get_output_details()[0]["dtype"] == np.int8
    assert float_accuracy - _accuracy(path, data) <= 0.01


@slow
def test_int8_tflite_activations_are_int8_with_float_io(int8_prune30):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(int8_prune30["tflite"]))
    tensors = {t["index"]: t for t in interpreter.get_tensor_details()}
    for op in interpreter._get_ops_details():
        if op["op_name"] in ("CONV_2D", "FULLY_CONNECTED"):
            assert tensors[op["inputs"][0]]["dtype"] == np.int8
    assert interpreter.get_input_details()[0]["dtype"] == np.float32
    assert interpreter.get_output_details()[0]["dtype"] == np.float32


# --- ptq, fp16, fp32 ---------------------------------------------------------------------------

@slow
def test_ptq_int8_artifacts(ptq, fp32, float_accuracy, data):
    assert ptq["tflite"].stat().st_size <= 0.30 * fp32["tflite"].stat().st_size
    for path in ptq.values():
        assert {k.dtype.name for k in _kernels(path)} == {"int8"}, path.name
        assert float_accuracy - _accuracy(path, data) <= 0.01, path.name


@slow
def test_ptq_with_int8_io(backend, float_model, data, tmp_path, float_accuracy):
    state = backend.quantize_ptq(ModelState(model=float_model),
                                 QuantizeConfig(mode="ptq", io_dtype="int8",
                                                calibration_samples=64),
                                 km.keras_context(data, tmp_path))
    path = backend.export(state, "tflite", tmp_path / "io8.tflite", km.keras_context(data,
                                                                                      tmp_path))
    from ai_edge_litert.interpreter import Interpreter

    assert Interpreter(model_path=str(path)).get_input_details()[0]["dtype"] == np.int8
    assert float_accuracy - _accuracy(path, data) <= 0.02


@slow
def test_fp16_artifacts(fp16, fp32, float_accuracy, data):
    assert fp16["tflite"].stat().st_size <= 0.55 * fp32["tflite"].stat().st_size
    assert fp16["onnx"].stat().st_size <= 0.55 * fp32["onnx"].stat().st_size
    for path in fp16.values():
        assert {k.dtype.name for k in _kernels(path)} == {"float16"}, path.name
        assert float_accuracy - _accuracy(path, data) <= 0.005, path.name
    import onnx

    model = onnx.load(str(fp16["onnx"]))
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT


@slow
def test_fp32_artifacts_match_keras(fp32, float_model, backend, data):
    import onnx

    expected = backend.predict(float_model, data.val[0])
    for path in fp32.values():
        assert {k.dtype.name for k in _kernels(path)} == {"float32"}
        run = km.run_tflite if path.suffix == ".tflite" else km.run_onnx
        np.testing.assert_allclose(run(path, data.val[0]), expected, atol=1e-4)
    model = onnx.load(str(fp32["onnx"]))
    onnx.checker.check_model(model)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param  # dynamic batch


@slow
def test_every_onnx_artifact_has_a_dynamic_batch(fp32, fp16, ptq, int8_prune30, data):
    import onnx

    for artifacts in (fp32, fp16, ptq, int8_prune30):
        model = onnx.load(str(artifacts["onnx"]))
        onnx.checker.check_model(model)
        assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param
        assert km.run_onnx(artifacts["onnx"], data.val[0][:7]).shape == (7, 10)


@slow
def test_export_does_not_change_the_model(backend, float_model, data, tmp_path):
    before = [w.copy() for w in float_model.get_weights()]
    ctx = km.keras_context(data, tmp_path)
    state = backend.quantize_ptq(ModelState(model=float_model),
                                 QuantizeConfig(mode="ptq", calibration_samples=16), ctx)
    _export_both(backend, state, ctx, tmp_path / "out")
    assert all(np.array_equal(a, b) for a, b in zip(before, float_model.get_weights()))


@slow
def test_functional_model_with_batchnorm_and_skip_quantizes(backend, data, tmp_path):
    small = Data(train=(data.train[0][:512], data.train[1][:512]), val=data.val)
    model = km.train(km.digits_functional(), small, epochs=2)
    ctx = km.keras_context(small, tmp_path)
    state = backend.quantize_qat(ModelState(model=model),
                                 QuantizeConfig(mode="qat", epochs=1), ctx)
    artifacts = _export_both(backend, state, ctx, tmp_path / "out")
    tflite_out = km.run_tflite(artifacts["tflite"], data.val[0])
    onnx_out = km.run_onnx(artifacts["onnx"], data.val[0])
    assert np.mean(tflite_out.argmax(1) == onnx_out.argmax(1)) >= 0.97
    for path in artifacts.values():
        read = km.tflite_kernel_weights if path.suffix == ".tflite" else km.onnx_kernel_weights
        assert {k.dtype.name for k in read(path)} == {"int8"}, path.name

"""The Keras and PyTorch backends, one suite parametrized over both (kits in
tests/backend_kits.py): pruning, int8 (QAT / PTQ), float16 and the TFLite / ONNX artifacts,
checked on real files in real runtimes.

A small digits CNN is trained per backend inside the tests; every number asserted here is read
back from the exported file or measured by running it in LiteRT / onnxruntime. Expensive work
(training, QAT, conversions) happens once per backend in module-scoped fixtures. What only one
framework has lives in tests/test_keras_loading.py and tests/test_torch_loading.py.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from backend_kits import KITS
from compressor.context import Data, ModelState
from compressor.errors import DataError
from compressor.passes.precision import PrecisionConfig
from compressor.passes.prune import PruneConfig
from compressor.passes.quantize import QuantizeConfig
from compressor.runtimes import inspect_artifact, open_runtime

slow = pytest.mark.slow
pytestmark = pytest.mark.filterwarnings("ignore:You are saving your model as an HDF5 file")
KERNEL_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")


@pytest.fixture(scope="module", params=sorted(KITS))
def backend_name(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def kit(backend_name):
    kit = KITS[backend_name]()
    kit.setup()
    yield kit
    kit.teardown()


@pytest.fixture(scope="module")
def data(kit) -> Data:
    return kit.data


@pytest.fixture(scope="module")
def backend(kit):
    return kit.backend


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, backend_name) -> Path:
    return tmp_path_factory.mktemp(backend_name)


@pytest.fixture(scope="module")
def ctx(kit, workdir):
    return kit.context(None, workdir / "work")


@pytest.fixture(scope="module")
def float_model(kit):
    return kit.trained_cnn()


@pytest.fixture(scope="module")
def float_accuracy(backend, float_model, data) -> float:
    accuracy = _score(backend.predict(float_model, data.val[0]), data)
    assert accuracy >= 0.95, "the test model itself must be good for drops to mean anything"
    return accuracy


def _export_both(backend, state, ctx, folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    return {fmt: backend.export(state, fmt, folder / f"model.{fmt}", ctx)
            for fmt in ("tflite", "onnx")}


@pytest.fixture(scope="module")
def fp32(backend, float_model, ctx, workdir):
    return _export_both(backend, ModelState(model=backend.load(float_model)), ctx,
                        workdir / "fp32")


@pytest.fixture(scope="module")
def int8_prune30_state(backend, float_model, ctx) -> ModelState:
    state = backend.prune(ModelState(model=backend.load(float_model)),
                          PruneConfig(sparsity=0.30, schedule="polynomial", epochs=2), ctx)
    return backend.quantize_qat(state, QuantizeConfig(mode="qat", epochs=2,
                                                      preserve_sparsity=True), ctx)


@pytest.fixture(scope="module")
def int8_prune30(backend, int8_prune30_state, ctx, workdir):
    return _export_both(backend, int8_prune30_state, ctx, workdir / "int8_prune30")


@pytest.fixture(scope="module")
def ptq_run(kit, backend, float_model, ctx, workdir) -> dict:
    """PTQ straight on the caller's model (no load()), with its weights from before."""
    before = kit.weights(float_model)
    state = backend.quantize_ptq(ModelState(model=float_model),
                                 QuantizeConfig(mode="ptq", calibration_samples=256), ctx)
    return {"weights_before": before,
            "artifacts": _export_both(backend, state, ctx, workdir / "ptq")}


@pytest.fixture(scope="module")
def ptq(ptq_run) -> dict[str, Path]:
    return ptq_run["artifacts"]


@pytest.fixture(scope="module")
def fp16(backend, float_model, ctx, workdir):
    state = backend.to_precision(ModelState(model=backend.load(float_model)),
                                 PrecisionConfig(dtype="float16"), ctx)
    return _export_both(backend, state, ctx, workdir / "fp16")


def _score(outputs: np.ndarray, data: Data) -> float:
    return float(np.mean(np.argmax(outputs, axis=-1) == data.val[1]))


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    return open_runtime(path, threads=1).predict(x)


def _accuracy(path: Path, data: Data) -> float:
    return _score(_run(path, data.val[0]), data)


def _kernels(path: Path):
    kernels = [w for w in inspect_artifact(path).weights if w.is_kernel]
    assert len(kernels) == 4, f"expected the 2 conv + 2 dense kernels in {path.name}"
    return kernels


def _zero_fraction(kernels) -> float:
    return sum(k.zeros for k in kernels) / sum(k.size for k in kernels)


def _size(path: Path) -> int:
    return path.stat().st_size


def _io_dtypes(path: Path) -> list[str]:
    info = inspect_artifact(path)
    return [d["dtype"] for d in info.inputs + info.outputs]


def _agreement(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean(np.argmax(a, axis=1) == np.argmax(b, axis=1)))


# --- lean imports (fast) ---------------------------------------------------

def test_backend_module_imports_no_framework(backend_name):
    kit = KITS[backend_name]
    code = (f"import sys, compressor, {', '.join(kit.backend_imports)}\n"
            f"from compressor.backends import get_backend; get_backend({backend_name!r})\n"
            f"heavy = {set(kit.framework_modules)!r}\n"
            "print(sorted(heavy & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# --- describing, pruning and training -------------------------------------------------------

@slow
def test_describe(kit, backend, float_model, data):
    info = backend.describe(float_model, data.val[0][:2])
    assert info.input_shape == (None, *kit.input_shape)
    assert info.input_dtype == "float32"
    assert info.output_shape == (None, 10)
    assert info.params == kit.params(float_model)
    assert info.size_bytes == 4 * info.params


@slow
def test_one_shot_pruning_is_exact_and_leaves_the_callers_model_alone(kit, backend, float_model,
                                                                      tmp_path):
    before = kit.weights(float_model)
    state = backend.prune(ModelState(model=backend.load(float_model)),
                          PruneConfig(sparsity=0.4, epochs=0), kit.context(None, tmp_path))
    assert state.sparsity == 0.4
    assert state.model is not float_model
    kernels = kit.kernels(state.model)
    assert len(kernels) == 4
    for kernel in kernels:   # every kernel pruned to the target, to within one element
        assert abs(np.count_nonzero(kernel == 0) - 0.4 * kernel.size) <= 1, kernel.shape
    after = kit.weights(float_model)
    assert len(before) == len(after)
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    assert all(np.count_nonzero(k == 0) == 0 for k in kit.kernels(float_model))


@slow
def test_fine_tuning_needs_training_data(kit, backend, float_model, data, tmp_path):
    ctx = kit.context(Data(val=data.val), tmp_path)
    with pytest.raises(DataError, match="needs training data.*train split"):
        backend.prune(ModelState(model=backend.load(float_model)),
                      PruneConfig(sparsity=0.3, epochs=1), ctx)


@slow
def test_pruning_is_deterministic_under_the_seed(kit, backend, float_model, tmp_path):
    config = PruneConfig(sparsity=0.5, schedule="constant", epochs=1)
    runs = [backend.prune(ModelState(model=backend.load(float_model)), config,
                          kit.context(kit.small(128), tmp_path / str(i), seed=7)).model
            for i in range(2)]
    first, second = kit.weights(runs[0]), kit.weights(runs[1])
    assert len(first) == len(second)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)


# --- fp32 (the other artifacts are compared with it) -------------------------------------------

@slow
def test_fp32_artifacts_match_the_model(fp32, float_model, backend, float_accuracy, data):
    import onnx

    expected = backend.predict(float_model, data.val[0])
    for path in fp32.values():
        assert {k.dtype for k in _kernels(path)} == {"float32"}, path.name
        outputs = _run(path, data.val[0])
        np.testing.assert_allclose(outputs, expected, atol=1e-4, err_msg=path.name)
        assert abs(_score(outputs, data) - float_accuracy) <= 0.003, path.name
        assert _io_dtypes(path) == ["float32", "float32"], path.name
    onnx.checker.check_model(onnx.load(str(fp32["onnx"])))


# --- int8_prune30: 30% pruning + sparsity-preserving QAT ---------------------------------------

@slow
def test_int8_prune30_keeps_accuracy_in_both_runtimes(int8_prune30, float_accuracy, data):
    for path in int8_prune30.values():
        assert float_accuracy - _accuracy(path, data) <= 0.01, path.name


@slow
def test_int8_prune30_is_int8_sparse_and_small(int8_prune30, fp32):
    for path in int8_prune30.values():
        kernels = _kernels(path)
        assert {k.dtype for k in kernels} == {"int8"}, path.name
        assert _zero_fraction(kernels) >= 0.28, path.name
    assert _size(int8_prune30["tflite"]) <= 0.30 * _size(fp32["tflite"])
    assert _size(int8_prune30["onnx"]) <= 0.35 * _size(fp32["onnx"])


@slow
def test_int8_artifacts_predict_like_the_qat_model_and_each_other(backend, int8_prune30_state,
                                                                  int8_prune30, data):
    framework = backend.predict(int8_prune30_state.model, data.val[0])
    outputs = {fmt: _run(path, data.val[0]) for fmt, path in int8_prune30.items()}
    for fmt, out in outputs.items():
        assert _agreement(framework, out) >= 0.98, fmt
    assert _agreement(outputs["tflite"], outputs["onnx"]) >= 0.99


@slow
def test_int8_artifacts_have_float_io_and_int8_tflite_kernels(int8_prune30, kit):
    from ai_edge_litert.interpreter import Interpreter

    for path in int8_prune30.values():
        assert _io_dtypes(path) == ["float32", "float32"], path.name
    assert inspect_artifact(int8_prune30["onnx"]).inputs[0]["shape"] == [-1, *kit.input_shape]

    interpreter = Interpreter(model_path=str(int8_prune30["tflite"]))
    tensors = {t["index"]: t for t in interpreter.get_tensor_details()}
    kernel_ops = [op for op in interpreter._get_ops_details()   # LiteRT's only op listing
                  if op["op_name"] in KERNEL_OPS]
    assert len(kernel_ops) == 4
    for op in kernel_ops:
        assert tensors[op["inputs"][0]]["dtype"] == np.int8, op["op_name"]
        assert tensors[op["outputs"][0]]["dtype"] == np.int8, op["op_name"]


@slow
def test_qat_with_int8_io(backend, int8_prune30_state, ctx, tmp_path, float_accuracy, data):
    state = int8_prune30_state.replace(
        quantize=int8_prune30_state.quantize.model_copy(update={"io_dtype": "int8"}))
    path = backend.export(state, "tflite", tmp_path / "io8.tflite", ctx)
    assert _io_dtypes(path) == ["int8", "int8"]
    assert float_accuracy - _accuracy(path, data) <= 0.01


# --- ptq, fp16, every ONNX artifact ------------------------------------------------------------

@slow
def test_ptq_int8_artifacts(ptq, fp32, float_accuracy, data):
    for path in ptq.values():
        assert {k.dtype for k in _kernels(path)} == {"int8"}, path.name
        assert float_accuracy - _accuracy(path, data) <= 0.01, path.name
    assert _size(ptq["tflite"]) <= 0.30 * _size(fp32["tflite"])
    assert _size(ptq["onnx"]) <= 0.35 * _size(fp32["onnx"])


@slow
def test_ptq_with_int8_io(kit, backend, float_model, tmp_path, float_accuracy, data):
    ctx = kit.context(None, tmp_path / "work")
    state = backend.quantize_ptq(ModelState(model=backend.load(float_model)),
                                 QuantizeConfig(mode="ptq", io_dtype="int8",
                                                calibration_samples=64), ctx)
    path = backend.export(state, "tflite", tmp_path / "io8.tflite", ctx)
    assert _io_dtypes(path) == ["int8", "int8"]
    assert float_accuracy - _accuracy(path, data) <= 0.02


@slow
def test_fp16_artifacts(fp16, fp32, float_accuracy, data):
    for fmt, path in fp16.items():
        assert {k.dtype for k in _kernels(path)} == {"float16"}, path.name
        assert float_accuracy - _accuracy(path, data) <= 0.005, path.name
        assert _size(path) <= 0.55 * _size(fp32[fmt]), path.name
        assert _io_dtypes(path) == ["float32", "float32"], path.name


@slow
def test_every_onnx_artifact_has_a_dynamic_batch(kit, fp32, fp16, ptq, int8_prune30, data):
    import onnx

    for artifacts in (fp32, fp16, ptq, int8_prune30):
        model = onnx.load(str(artifacts["onnx"]))
        onnx.checker.check_model(model)
        assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param
        assert inspect_artifact(artifacts["onnx"]).inputs[0]["shape"] == [-1, *kit.input_shape]
        assert _run(artifacts["onnx"], data.val[0][:7]).shape == (7, 10)


# --- the caller's model, a BatchNorm + skip model ----------------------------------------------

@slow
def test_quantizing_and_exporting_leave_the_model_alone(kit, ptq_run, float_model):
    before, after = ptq_run["weights_before"], kit.weights(float_model)
    assert len(before) == len(after)
    assert all(np.array_equal(a, b) for a, b in zip(before, after))


@slow
def test_batchnorm_skip_model_through_qat(kit, backend, data, tmp_path):
    """Conv + BatchNorm + a skip connection: QAT folds BN, both artifacts agree with the
    framework and with each other, with int8 kernels."""
    model, train_data = kit.bn_skip_model()
    ctx = kit.context(train_data, tmp_path / "work")
    state = backend.quantize_qat(ModelState(model=backend.load(model)),
                                 QuantizeConfig(mode="qat", epochs=1), ctx)
    framework = backend.predict(state.model, data.val[0])
    artifacts = _export_both(backend, state, ctx, tmp_path / "out")
    outputs = {fmt: _run(path, data.val[0]) for fmt, path in artifacts.items()}
    for fmt, path in artifacts.items():
        assert _agreement(framework, outputs[fmt]) >= 0.97, fmt
        assert {w.dtype for w in inspect_artifact(path).weights if w.is_kernel} == {"int8"}, fmt
    assert _agreement(outputs["tflite"], outputs["onnx"]) >= 0.97


@slow
def test_plain_qat_int8_onnx(backend, float_model, ctx, workdir, float_accuracy, data):
    state = backend.quantize_qat(ModelState(model=backend.load(float_model)),
                                 QuantizeConfig(mode="qat", epochs=2), ctx)
    path = backend.export(state, "onnx", workdir / "qat" / "model.onnx", ctx)
    assert {k.dtype for k in _kernels(path)} == {"int8"}
    assert float_accuracy - _accuracy(path, data) <= 0.01

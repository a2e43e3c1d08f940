"""The PyTorch backend on a small digits CNN trained here: loading, pruning, int8 (QAT / PTQ),
float16, and the ONNX / TFLite artifacts measured in their real runtimes.

Expensive work (training, QAT, conversions) happens once per module in fixtures. Torch runs
on one thread: on shared 2-core machines that is faster than two contended ones.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import torch_models as tm
from compressor.backends.torch_backend import TorchBackend
from compressor.context import Data, ModelState
from compressor.data import digits
from compressor.errors import BackendUnavailableError, DataError, ModelLoadError, RecipeError
from compressor.passes.precision import PrecisionConfig
from compressor.passes.prune import PruneConfig
from compressor.passes.quantize import QuantizeConfig
from compressor.runtimes import inspect_artifact, open_runtime

slow = pytest.mark.slow
PRUNE30 = PruneConfig(sparsity=0.30, schedule="polynomial", epochs=2)
QAT = QuantizeConfig(mode="qat", epochs=2, preserve_sparsity=True)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data() -> Data:
    return digits("NCHW")


@pytest.fixture(scope="module")
def backend() -> TorchBackend:
    return TorchBackend()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("torch")


@pytest.fixture(scope="module")
def ctx(data, workdir):
    return tm.torch_context(data, workdir / "work")


@pytest.fixture(scope="module")
def float_model(data):
    return tm.train(tm.digits_cnn(), data)


@pytest.fixture(scope="module")
def float_accuracy(backend, float_model, data) -> float:
    accuracy = tm.accuracy(backend.predict(float_model, data.val[0]), data.val[1])
    assert accuracy >= 0.95, "the test model itself must be good for drops to mean anything"
    return accuracy


def _export_both(backend, state, ctx, folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    return {fmt: backend.export(state, fmt, folder / f"model.{fmt}", ctx)
            for fmt in ("tflite", "onnx")}


@pytest.fixture(scope="module")
def fp32(backend, float_model, ctx, workdir):
    return _export_both(backend, ModelState(model=backend.load(float_model)), ctx, workdir / "fp32")


@pytest.fixture(scope="module")
def int8_prune30_state(backend, float_model, ctx):
    state = backend.prune(ModelState(model=backend.load(float_model)), PRUNE30, ctx)
    return backend.quantize_qat(state, QAT, ctx)


@pytest.fixture(scope="module")
def int8_prune30(backend, int8_prune30_state, ctx, workdir):
    return _export_both(backend, int8_prune30_state, ctx, workdir / "int8_prune30")


@pytest.fixture(scope="module")
def fp16(backend, float_model, ctx, workdir):
    state = backend.to_precision(ModelState(model=backend.load(float_model)),
                                 PrecisionConfig(dtype="float16"), ctx)
    return _export_both(backend, state, ctx, workdir / "fp16")


def _accuracy(path: Path, data: Data) -> float:
    return tm.accuracy(open_runtime(path, threads=1).predict(data.val[0]), data.val[1])


def _kernels(path: Path):
    kernels = [w for w in inspect_artifact(path).weights if w.is_kernel]
    assert len(kernels) == 4, f"expected the 2 conv + 2 linear kernels in {path.name}"
    return kernels


def _zero_fraction(kernels) -> float:
    return sum(k.zeros for k in kernels) / sum(k.size for k in kernels)


def _size(path: Path) -> int:
    return path.stat().st_size


# --- lean imports and loading (fast) -------------------------------------------------------

def test_torch_backend_imports_no_framework():
    code = ("import sys, compressor, compressor.backends.torch_backend as tb; tb.TorchBackend(); "
            "heavy = [m for m in ('torch', 'torchao', 'litert_torch', 'onnx') if m in sys.modules]; "
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_module_function_with_weights_loads_the_weights(backend, float_model, data, tmp_path):
    weights = tmp_path / "w.pt"
    torch.save(float_model.state_dict(), weights)
    loaded = backend.load("torch_models:digits_cnn", weights=str(weights))
    np.testing.assert_allclose(backend.predict(loaded, data.val[0][:16]),
                               backend.predict(float_model, data.val[0][:16]), rtol=1e-5, atol=1e-5)


def test_file_path_reference_is_imported(backend, tmp_path):
    code = tmp_path / "my_model.py"
    code.write_text("import torch\n\ndef build():\n    return torch.nn.Linear(4, 2)\n")
    assert isinstance(backend.load(f"{code}:build"), torch.nn.Linear)


@pytest.mark.parametrize("ref, message", [
    ("no_such_module_xyz:build", "cannot import no_such_module_xyz"),
    ("torch_models:no_such_function", "has no function 'no_such_function'"),
    ("torch_models:accuracy", "raised TypeError"),
    ("missing.pt2", "does not exist"),
])
def test_bad_references_raise_model_load_error(backend, ref, message):
    with pytest.raises(ModelLoadError, match=message):
        backend.load(ref)


def test_mismatched_weights_list_missing_and_unexpected_keys(backend, tmp_path):
    weights = tmp_path / "w.pt"
    state = tm.digits_cnn().state_dict()
    state["extra.weight"] = state.pop("head.3.weight")
    torch.save(state, weights)
    with pytest.raises(ModelLoadError, match=r"missing keys: head\.3\.weight.*unexpected keys: "
                                             r"extra\.weight"):
        backend.load("torch_models:digits_cnn", weights=str(weights))


def test_weights_of_another_shape_are_refused(backend, tmp_path):
    weights = tmp_path / "w.pt"
    torch.save(tm.DigitsCNN(filters=(8, 16)).state_dict(), weights)
    with pytest.raises(ModelLoadError, match="size mismatch"):
        backend.load("torch_models:digits_cnn", weights=str(weights))


def test_pickled_module_needs_trust_pickle(backend, tmp_path):
    path = tmp_path / "model.pt"
    torch.save(tm.digits_cnn(), path)
    with pytest.raises(ModelLoadError, match="is a pickled module; loading it runs code from the "
                                             "file. Pass --trust-pickle"):
        backend.load(str(path))
    assert isinstance(backend.load(str(path), trust_pickle=True), tm.DigitsCNN)


def test_torchscript_needs_trust_pickle(backend, tmp_path):
    path = tmp_path / "model.ts"
    torch.jit.script(torch.nn.Linear(4, 2)).save(str(path))
    with pytest.raises(ModelLoadError, match="TorchScript module.*--trust-pickle"):
        backend.load(str(path))
    assert isinstance(backend.load(str(path), trust_pickle=True), torch.nn.Module)


@pytest.mark.parametrize("name, content, message", [
    ("garbage.pt", b"not a model", "not a readable PyTorch file"),
    ("garbage.pt2", b"not a model", "not a readable .pt2 file"),
    ("weights_only.pt", None, "holds only weights"),
])
def test_unreadable_or_wrong_files_raise_model_load_error(backend, tmp_path, name, content, message):
    path = tmp_path / name
    if content is None:
        torch.save(tm.digits_cnn().state_dict(), path)
    else:
        path.write_bytes(content)
    with pytest.raises(ModelLoadError, match=message):
        backend.load(str(path))


def test_missing_weights_file(backend, tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist; check the --weights path"):
        backend.load("torch_models:digits_cnn", weights=str(tmp_path / "nope.pt"))


def test_pt2_with_dynamic_batch_loads_and_describes(backend, float_model, data, tmp_path):
    path = tmp_path / "model.pt2"
    x = torch.from_numpy(data.val[0][:2])
    torch.export.save(torch.export.export(float_model, (x,),
                                          dynamic_shapes=({0: torch.export.Dim.DYNAMIC},)), path)
    loaded = backend.load(str(path))
    np.testing.assert_allclose(backend.predict(loaded, data.val[0]),
                               backend.predict(float_model, data.val[0]), rtol=1e-4, atol=1e-4)
    info = backend.describe(loaded)   # an exported graph declares its input: no example needed
    assert (info.input_shape, info.input_dtype, info.output_shape) == \
        ((None, 1, 8, 8), "float32", (None, 10))


def test_pt2_with_fixed_batch_is_refused(backend, float_model, data, tmp_path):
    path = tmp_path / "fixed.pt2"
    torch.export.save(torch.export.export(float_model, (torch.from_numpy(data.val[0][:1]),)), path)
    with pytest.raises(ModelLoadError, match="fixed batch size of 1; export it with a dynamic"):
        backend.load(str(path))


def test_describe_needs_and_checks_an_example(backend, data):
    model = tm.digits_cnn()
    info = backend.describe(model, data.val[0][:2])
    assert info.params == sum(p.numel() for p in model.parameters())
    assert (info.input_shape, info.input_dtype, info.output_shape) == \
        ((None, 1, 8, 8), "float32", (None, 10))
    assert info.size_bytes == 4 * info.params
    with pytest.raises(DataError, match="needs example inputs"):
        backend.describe(model)
    with pytest.raises(DataError, match="PyTorch images are NCHW"):
        backend.describe(model, np.zeros((2, 8, 8, 1), np.float32))


def test_predict_leaves_train_mode_as_it_was(backend, data):
    model = tm.digits_cnn().train()
    backend.predict(model, data.val[0][:4])
    assert model.training


def test_unsupported_requests_raise_typed_errors(backend, ctx):
    state = ModelState(model=tm.digits_cnn())
    with pytest.raises(BackendUnavailableError, match="use dtype: float16"):
        backend.to_precision(state, PrecisionConfig(dtype="bfloat16"), ctx)
    quantized = state.replace(quantize=QuantizeConfig(mode="qat"))
    with pytest.raises(RecipeError, match="put quantize last"):
        backend.prune(quantized, PruneConfig(sparsity=0.3), ctx)
    with pytest.raises(BackendUnavailableError, match="cannot export to 'tfjs'"):
        backend.export(state, "tfjs", Path("model.tfjs"), ctx)


# --- pruning (fast) --------------------------------------------------------------------------

def test_one_shot_pruning_is_exact_permanent_and_leaves_the_caller_alone(backend, ctx):
    caller = tm.digits_cnn()
    before = {k: v.clone() for k, v in caller.state_dict().items()}
    state = backend.prune(ModelState(model=backend.load(caller)),
                          PruneConfig(sparsity=0.3, epochs=0), ctx)
    for name, weight in state.model.state_dict().items():
        if name.endswith("weight"):
            assert abs(float((weight == 0).float().mean()) - 0.3) < 0.002, name
    assert state.sparsity == 0.3
    assert all(not n.endswith(("_orig", "_mask")) for n in state.model.state_dict())
    assert all(not m._forward_pre_hooks for m in state.model.modules())
    assert all(torch.equal(before[k], v) for k, v in caller.state_dict().items())


def test_pruning_is_deterministic_under_the_seed(backend, float_model, data, tmp_path):
    small = Data(train=(data.train[0][:256], data.train[1][:256]), val=data.val)
    config = PruneConfig(sparsity=0.5, schedule="constant", epochs=1)
    runs = [backend.prune(ModelState(model=backend.load(float_model)), config,
                          tm.torch_context(small, tmp_path, seed=7)).model for _ in range(2)]
    for a, b in zip(runs[0].state_dict().values(), runs[1].state_dict().values()):
        assert torch.equal(a, b)


def test_polynomial_schedule_reaches_the_target_before_the_last_epoch():
    from compressor.backends.torch_prune import SparsitySchedule

    schedule = SparsitySchedule.for_run(PruneConfig(sparsity=0.3, epochs=2), steps_per_epoch_=43)
    assert schedule.sparsity(0) == 0.0
    assert 0.0 < schedule.sparsity(20) < 0.3
    assert schedule.sparsity(43) == pytest.approx(0.3)
    assert schedule.sparsity(86) == pytest.approx(0.3)


def test_fine_tuning_needs_training_data(backend, data, tmp_path):
    ctx = tm.torch_context(Data(val=data.val), tmp_path)
    with pytest.raises(DataError, match="needs training data"):
        backend.prune(ModelState(model=tm.digits_cnn()), PruneConfig(sparsity=0.3), ctx)


# --- fp32 (first: the other artifacts are compared with it) -----------------------------------

@slow
def test_fp32_artifacts_match_the_model(fp32, float_accuracy, data):
    for path in fp32.values():
        assert abs(_accuracy(path, data) - float_accuracy) <= 0.003, path.name


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
    assert _size(int8_prune30["onnx"]) <= 0.35 * _size(fp32["onnx"])
    assert _size(int8_prune30["tflite"]) <= 0.35 * _size(fp32["tflite"])


@slow
def test_int8_artifacts_have_float_io_and_a_dynamic_onnx_batch(int8_prune30):
    tflite, onnx = inspect_artifact(int8_prune30["tflite"]), inspect_artifact(int8_prune30["onnx"])
    for info in (tflite, onnx):
        assert [d["dtype"] for d in info.inputs + info.outputs] == ["float32", "float32"]
    assert onnx.inputs[0]["shape"] == [-1, 1, 8, 8]


@slow
def test_int8_tflite_computes_conv_and_linear_in_int8(int8_prune30):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(int8_prune30["tflite"]))
    tensors = {t["index"]: t for t in interpreter.get_tensor_details()}
    kernel_ops = [op for op in interpreter._get_ops_details()   # LiteRT's only op listing
                  if op["op_name"] in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")]
    assert len(kernel_ops) == 4
    for op in kernel_ops:
        assert tensors[op["inputs"][0]]["dtype"] == np.int8, op["op_name"]
        assert tensors[op["outputs"][0]]["dtype"] == np.int8, op["op_name"]


@slow
def test_qat_state_predicts_like_its_artifacts(backend, int8_prune30_state, int8_prune30, data):
    framework = np.argmax(backend.predict(int8_prune30_state.model, data.val[0]), axis=1)
    for path in int8_prune30.values():
        runtime = np.argmax(open_runtime(path, threads=1).predict(data.val[0]), axis=1)
        assert np.mean(framework == runtime) >= 0.98, path.name


# --- fp16, ptq, plain qat ----------------------------------------------------------------------

@slow
def test_fp16_weights_small_and_accurate(fp16, fp32, float_accuracy, data):
    for fmt, path in fp16.items():
        assert {k.dtype for k in _kernels(path)} == {"float16"}, path.name
        assert float_accuracy - _accuracy(path, data) <= 0.005, path.name
        assert _size(path) <= 0.55 * _size(fp32[fmt]), path.name
        info = inspect_artifact(path)
        assert [d["dtype"] for d in info.inputs + info.outputs] == ["float32", "float32"]


@slow
def test_ptq_int8_artifacts(backend, float_model, ctx, workdir, fp32, float_accuracy, data):
    state = backend.quantize_ptq(ModelState(model=backend.load(float_model)),
                                 QuantizeConfig(mode="ptq", calibration_samples=256), ctx)
    artifacts = _export_both(backend, state, ctx, workdir / "ptq")
    for fmt, path in artifacts.items():
        assert {k.dtype for k in _kernels(path)} == {"int8"}, path.name
        assert float_accuracy - _accuracy(path, data) <= 0.01, path.name
        assert _size(path) <= 0.35 * _size(fp32[fmt]), path.name


@slow
def test_plain_qat_int8_onnx(backend, float_model, ctx, workdir, float_accuracy, data):
    state = backend.quantize_qat(ModelState(model=backend.load(float_model)),
                                 QuantizeConfig(mode="qat", epochs=1), ctx)
    path = backend.export(state, "onnx", workdir / "qat" / "model.onnx", ctx)
    assert {k.dtype for k in _kernels(path)} == {"int8"}
    assert float_accuracy - _accuracy(path, data) <= 0.01


@slow
def test_int8_tflite_with_int8_io(backend, float_model, data, tmp_path):
    ctx = tm.torch_context(data, tmp_path / "work")
    state = backend.quantize_ptq(ModelState(model=backend.load(float_model)),
                                 QuantizeConfig(mode="ptq", io_dtype="int8", calibration_samples=64),
                                 ctx)
    info = inspect_artifact(backend.export(state, "tflite", tmp_path / "io8.tflite", ctx))
    assert [d["dtype"] for d in info.inputs + info.outputs] == ["int8", "int8"]


@slow
def test_batchnorm_residual_model_through_qat(backend, data, tmp_path):
    """Conv + BatchNorm + a skip connection: QAT folds BN, both artifacts agree with torch."""
    model = tm.train(tm.digits_residual(), data, epochs=3)
    ctx = tm.torch_context(data, tmp_path / "work")
    state = backend.quantize_qat(ModelState(model=backend.load(model)),
                                 QuantizeConfig(mode="qat", epochs=1), ctx)
    framework = np.argmax(backend.predict(state.model, data.val[0]), axis=1)
    for fmt in ("onnx", "tflite"):
        path = backend.export(state, fmt, tmp_path / f"model.{fmt}", ctx)
        runtime = np.argmax(open_runtime(path, threads=1).predict(data.val[0]), axis=1)
        assert np.mean(framework == runtime) >= 0.97, fmt

"""The Keras and PyTorch backends, one suite parametrized over both (fixtures in conftest.py):
imports, describing, pruning, and the float32 / float16 artifacts, checked on real files in
real runtimes. int8 lives in test_backend_int8.py; what only one framework has in
test_keras_load.py and test_torch_load.py."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from support.artifact_checks import accuracy, io_dtypes, kernels, run, score, size
from support.backend_kits import KITS

from compressor.core.context import Data, ModelState
from compressor.errors import DataError
from compressor.runtimes import inspect_artifact
from compressor.config.steps import PruneConfig

slow = pytest.mark.slow


def test_backend_module_imports_no_framework(backend_name):
    kit = KITS[backend_name]
    code = (f"import sys, compressor, {', '.join(kit.backend_imports)}\n"
            f"from compressor.backends import get_backend; get_backend({backend_name!r})\n"
            f"heavy = {set(kit.framework_modules)!r}\n"
            "print(sorted(heavy & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


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
    state = kit.apply(ModelState(model=backend.load(float_model)),
                      PruneConfig(sparsity=0.4, epochs=0), kit.context(None, tmp_path))
    assert state.last(PruneConfig).sparsity == 0.4
    assert state.model is not float_model
    found = kit.kernels(state.model)
    assert len(found) == 4
    for kernel in found:   # every kernel pruned to the target, to within one element
        assert abs(np.count_nonzero(kernel == 0) - 0.4 * kernel.size) <= 1, kernel.shape
    after = kit.weights(float_model)
    assert len(before) == len(after)
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    assert all(np.count_nonzero(k == 0) == 0 for k in kit.kernels(float_model))


@slow
def test_fine_tuning_needs_training_data(kit, backend, float_model, data, tmp_path):
    ctx = kit.context(Data(val=data.val), tmp_path)
    with pytest.raises(DataError, match="needs training data.*train split"):
        kit.apply(ModelState(model=backend.load(float_model)),
                  PruneConfig(sparsity=0.3, epochs=1), ctx)


@slow
def test_pruning_is_deterministic_under_the_seed(kit, backend, float_model, tmp_path):
    config = PruneConfig(sparsity=0.5, schedule="constant", epochs=1)
    runs = [kit.apply(ModelState(model=backend.load(float_model)), config,
                      kit.context(kit.small(128), tmp_path / str(i), seed=7)).model
            for i in range(2)]
    first, second = kit.weights(runs[0]), kit.weights(runs[1])
    assert len(first) == len(second)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)


@slow
def test_fp32_artifacts_match_the_model(fp32, float_model, backend, float_accuracy, data):
    import onnx

    expected = backend.predict(float_model, data.val[0])
    for path in fp32.values():
        assert {k.dtype for k in kernels(path)} == {"float32"}, path.name
        outputs = run(path, data.val[0])
        np.testing.assert_allclose(outputs, expected, atol=1e-4, err_msg=path.name)
        assert abs(score(outputs, data) - float_accuracy) <= 0.003, path.name
        assert io_dtypes(path) == ["float32", "float32"], path.name
    onnx.checker.check_model(onnx.load(str(fp32["onnx"])))


@slow
def test_fp16_artifacts(fp16, fp32, float_accuracy, data):
    for fmt, path in fp16.items():
        assert {k.dtype for k in kernels(path)} == {"float16"}, path.name
        assert float_accuracy - accuracy(path, data) <= 0.005, path.name
        assert size(path) <= 0.55 * size(fp32[fmt]), path.name
        assert io_dtypes(path) == ["float32", "float32"], path.name


@slow
def test_every_onnx_artifact_has_a_dynamic_batch(kit, fp32, fp16, ptq, int8_prune30, data):
    import onnx

    for artifacts in (fp32, fp16, ptq, int8_prune30):
        model = onnx.load(str(artifacts["onnx"]))
        onnx.checker.check_model(model)
        assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param
        assert inspect_artifact(artifacts["onnx"]).inputs[0]["shape"] == [-1, *kit.input_shape]
        assert run(artifacts["onnx"], data.val[0][:7]).shape == (7, 10)

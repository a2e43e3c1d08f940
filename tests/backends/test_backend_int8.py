"""int8 from both backends (fixtures in conftest.py): pruning + sparsity-preserving QAT, PTQ,
int8 I/O, a BatchNorm + skip model; every number read back from the exported file or measured
by running it in LiteRT / onnxruntime."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from support.artifact_checks import (FLOAT_KERNEL_OPS, INT8_KERNEL_OPS, accuracy, agreement, export_both,
                             io_dtypes, kernels, onnxruntime_graph, run, score, size,
                             zero_fraction)

from compressor.core.context import ModelState
from compressor.runtimes import inspect_artifact
from compressor.config.steps import QuantizeConfig

slow = pytest.mark.slow
pytestmark = pytest.mark.filterwarnings("ignore:You are saving your model as an HDF5 file")
KERNEL_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")


@slow
def test_int8_prune30_keeps_accuracy_in_both_runtimes(int8_prune30, float_accuracy, data):
    for path in int8_prune30.values():
        assert float_accuracy - accuracy(path, data) <= 0.01, path.name


@slow
def test_int8_prune30_is_int8_sparse_and_small(int8_prune30, fp32):
    for path in int8_prune30.values():
        found = kernels(path)
        assert {k.dtype for k in found} == {"int8"}, path.name
        assert zero_fraction(found) >= 0.28, path.name
    assert size(int8_prune30["tflite"]) <= 0.30 * size(fp32["tflite"])
    assert size(int8_prune30["onnx"]) <= 0.35 * size(fp32["onnx"])


@slow
def test_int8_artifacts_predict_like_the_qat_model_and_each_other(backend, int8_prune30_state,
                                                                  int8_prune30, data):
    framework = backend.predict(int8_prune30_state.model, data.val[0])
    outputs = {fmt: run(path, data.val[0]) for fmt, path in int8_prune30.items()}
    for fmt, out in outputs.items():
        assert agreement(framework, out) >= 0.98, fmt
    assert agreement(outputs["tflite"], outputs["onnx"]) >= 0.99


@slow
def test_int8_artifacts_have_float_io_and_int8_tflite_kernels(int8_prune30, kit):
    from ai_edge_litert.interpreter import Interpreter

    for path in int8_prune30.values():
        assert io_dtypes(path) == ["float32", "float32"], path.name
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
    qat = int8_prune30_state.last(QuantizeConfig)
    state = int8_prune30_state.replace(
        steps=(*int8_prune30_state.steps[:-1], qat.model_copy(update={"io_dtype": "int8"})),
        scheme=dataclasses.replace(int8_prune30_state.scheme, io_dtype="int8"))
    path = backend.export(state, "tflite", tmp_path / "io8.tflite", ctx)
    assert io_dtypes(path) == ["int8", "int8"]
    assert float_accuracy - accuracy(path, data) <= 0.01


@slow
def test_ptq_int8_artifacts(ptq, fp32, float_accuracy, data):
    for path in ptq.values():
        assert {k.dtype for k in kernels(path)} == {"int8"}, path.name
        assert float_accuracy - accuracy(path, data) <= 0.01, path.name
    assert size(ptq["tflite"]) <= 0.30 * size(fp32["tflite"])
    assert size(ptq["onnx"]) <= 0.35 * size(fp32["onnx"])


@slow
def test_ptq_with_int8_io(kit, backend, float_model, tmp_path, float_accuracy, data):
    ctx = kit.context(None, tmp_path / "work")
    state = kit.apply(ModelState(model=backend.load(float_model)),
                      QuantizeConfig(mode="ptq", io_dtype="int8", calibration_samples=64), ctx)
    path = backend.export(state, "tflite", tmp_path / "io8.tflite", ctx)
    assert io_dtypes(path) == ["int8", "int8"]
    assert float_accuracy - accuracy(path, data) <= 0.02


@slow
def test_quantizing_and_exporting_leave_the_model_alone(kit, ptq_run, float_model):
    before, after = ptq_run["weights_before"], kit.weights(float_model)
    assert len(before) == len(after)
    assert all(np.array_equal(a, b) for a, b in zip(before, after))


@slow
def test_batchnorm_skip_model_through_qat(kit, backend, data, tmp_path):
    """Conv + BatchNorm + a skip connection: QAT folds BN, both artifacts agree with the
    framework and with each other, with int8 kernels; onnxruntime runs every conv / dense of
    the ONNX in int8, with no dequantize -> requantize chain."""
    model, train_data = kit.bn_skip_model()
    ctx = kit.context(train_data, tmp_path / "work")
    state = kit.apply(ModelState(model=backend.load(model)),
                      QuantizeConfig(mode="qat", epochs=1), ctx)
    framework = backend.predict(state.model, data.val[0])
    artifacts = export_both(backend, state, ctx, tmp_path / "out")
    # The TFLite carries the QAT ranges; the ONNX is calibrated anew by onnxruntime's
    # quantizer, so on this briefly trained (low-margin) net it is held to the QAT model's
    # accuracy rather than to its exact predictions.
    assert agreement(framework, run(artifacts["tflite"], data.val[0])) >= 0.97
    for fmt, path in artifacts.items():
        assert accuracy(path, data) >= score(framework, data) - 0.03, fmt
        assert {w.dtype for w in inspect_artifact(path).weights if w.is_kernel} == {"int8"}, fmt
    ops, requantized = onnxruntime_graph(artifacts["onnx"], tmp_path)
    assert not [op for op in FLOAT_KERNEL_OPS if op in ops], ops
    assert sum(ops.get(op, 0) for op in INT8_KERNEL_OPS) == 3, ops    # 2 conv + the dense head
    assert ops.get("QLinearAdd") == 1 and requantized == 0, ops


@slow
def test_plain_qat_int8_onnx(kit, backend, float_model, ctx, workdir, float_accuracy, data):
    state = kit.apply(ModelState(model=backend.load(float_model)),
                      QuantizeConfig(mode="qat", epochs=2), ctx)
    path = backend.export(state, "onnx", workdir / "qat" / "model.onnx", ctx)
    assert {k.dtype for k in kernels(path)} == {"int8"}
    assert float_accuracy - accuracy(path, data) <= 0.01

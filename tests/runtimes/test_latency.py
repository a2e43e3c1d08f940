"""Latency timed in a fresh process that loads only the runtime (runtimes/latency.py)."""
from __future__ import annotations

import numpy as np
import pytest

from compressor.core.context import Data
from compressor.runtimes.latency import measure_latency
from compressor.config.steps import ValidateConfig
from compressor.tasks.array.evaluate import evaluate_artifact

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


@pytest.fixture
def matmul_onnx(tmp_path):
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.eye(16, 3, dtype=np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
                              [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    return path


def test_latency_runs_in_a_process_without_frameworks(matmul_onnx):
    timing = measure_latency(matmul_onnx, np.ones((5, 16), np.float32), threads=1)
    assert timing["threads"] == 1 and timing["frameworks"] == []
    assert 0 < timing["p50"] <= timing["p90"] < 100


def test_report_row_records_latency_threads(matmul_onnx):
    x = np.random.default_rng(0).random((8, 16), dtype=np.float32)
    data = Data(train=None, val=(x, np.argmax(x[:, :3], axis=1)))
    row = evaluate_artifact(matmul_onnx, data, x[:, :3], 1.0, ValidateConfig(), threads=2)
    assert row["latency_threads"] == 2 and row["latency_ms_p50"] > 0
    assert row["metric_value"] == 1.0


def test_failed_timing_is_a_typed_error(tmp_path):
    from compressor.errors import BackendUnavailableError

    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not onnx")
    with pytest.raises(BackendUnavailableError, match="--no-latency"):
        measure_latency(broken, np.ones((1, 4), np.float32), threads=1)

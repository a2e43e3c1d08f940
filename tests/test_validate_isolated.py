"""Artifacts are validated in a child process (issue 27, item 2): a runtime that dies of a
signal (simulated: the child SIGSEGVs itself where onnxruntime would create the session) is one
error line for that artifact and exit 5, the other format kept; an ONNX file that crashes only
at ORT_ENABLE_ALL is validated at the next level, and the report row says which."""
from __future__ import annotations

import json
from importlib import metadata

import numpy as np
import pytest

from compressor.core.context import Data
from compressor.errors import DataError
from compressor.runtimes.isolated import CRASH_HOOK, RuntimeCrashError, RuntimeRunError, run_isolated
from compressor.config.steps import ValidateConfig
from compressor.tasks.array.evaluate import evaluate_artifact

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
ORT = f"onnxruntime {metadata.version('onnxruntime')}"


@pytest.fixture
def two_output_onnx(tmp_path):
    """y = x @ eye(16, 3) and z = 2 y, under names a converter might give (with '/' and ':')."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("MatMul", ["x", "w"], ["head/logits:0"]),
             helper.make_node("Mul", ["head/logits:0", "two"], ["aux"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
        [helper.make_tensor_value_info("head/logits:0", TensorProto.FLOAT, ["n", 3]),
         helper.make_tensor_value_info("aux", TensorProto.FLOAT, ["n", 3])],
        [numpy_helper.from_array(np.eye(16, 3, dtype=np.float32), "w"),
         numpy_helper.from_array(np.array(2, np.float32), "two")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    return path


@pytest.fixture
def val():
    x = np.random.default_rng(0).random((40, 16), dtype=np.float32)
    return x, np.argmax(x[:, :3], axis=1)


def test_the_child_returns_every_output_by_name_and_times_latency_without_frameworks(
        two_output_onnx, val, tmp_path):
    x, _ = val
    run = run_isolated(two_output_onnx, x, tmp_path, threads=1, latency=True)
    assert list(run.outputs) == ["head/logits:0", "aux"]
    np.testing.assert_allclose(run.outputs["aux"], 2 * x[:, :3], rtol=1e-6)
    assert (run.runtime, run.threads, run.optimization_level, run.crashed) == (ORT, 1, "ORT_ENABLE_ALL", ())
    assert run.latency["frameworks"] == [] and run.latency["threads"] == 1 and run.latency["p50"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "tmp"]   # the .npz files went


def test_a_crash_at_the_default_level_is_validated_at_the_next(two_output_onnx, val, monkeypatch):
    monkeypatch.setenv(CRASH_HOOK, "m.onnx@ORT_ENABLE_ALL")
    x, y = val
    reference = {"head/logits:0": x[:, :3], "aux": 2 * x[:, :3]}
    row = evaluate_artifact(two_output_onnx, Data(val=(x, y)), reference, 1.0, ValidateConfig(),
                            latency=False)
    assert row["metric_value"] == 1.0 and row["ort_optimization_level"] == "ORT_ENABLE_EXTENDED"
    assert row["runtime_warning"] == (
        f"m.onnx crashed {ORT} at ORT_ENABLE_ALL: SIGSEGV while creating its session; validated "
        "at ORT_ENABLE_EXTENDED: open it with SessionOptions.graph_optimization_level = "
        "ORT_ENABLE_EXTENDED")


def test_a_crash_at_every_level_is_one_typed_error(two_output_onnx, val, monkeypatch, tmp_path):
    monkeypatch.setenv(CRASH_HOOK, "m.onnx")
    with pytest.raises(RuntimeCrashError) as caught:
        run_isolated(two_output_onnx, val[0], tmp_path)
    assert str(caught.value) == (
        f"m.onnx crashed {ORT} (SIGSEGV while creating its session) at every graph optimization "
        "level (ORT_ENABLE_ALL, ORT_ENABLE_EXTENDED, ORT_ENABLE_BASIC, ORT_DISABLE_ALL)")


def test_errors_in_the_child_come_back_typed(two_output_onnx, tmp_path):
    with pytest.raises(DataError, match="the model's inputs are x but the data has a, b"):
        run_isolated(two_output_onnx, {"a": np.zeros((2, 16), np.float32),
                                       "b": np.zeros((2, 16), np.float32),
                                       "c": np.zeros((2, 16), np.float32)}, tmp_path)
    with pytest.raises(RuntimeRunError, match=rf"^m.onnx: {ORT} failed running it \(InvalidArgument"):
        run_isolated(two_output_onnx, np.zeros((2, 5), np.float32), tmp_path)


@pytest.mark.slow
def test_a_crashing_format_exits_5_and_keeps_the_other(untrained_keras_file, tmp_path, monkeypatch,
                                                       capsys):
    from compressor.cli import main

    monkeypatch.setenv(CRASH_HOOK, "model.onnx")
    out = tmp_path / "out"
    code = main(["--recipe", "fp16", str(untrained_keras_file), "--out", str(out), "--no-latency"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    crash = (f"model.onnx crashed {ORT} (SIGSEGV while creating its session) at every graph "
             "optimization level (ORT_ENABLE_ALL, ORT_ENABLE_EXTENDED, ORT_ENABLE_BASIC, "
             "ORT_DISABLE_ALL)")
    assert code == 5
    assert errors == [f"error: onnx not produced: {crash} (artifacts and report in {out})"]
    report = json.loads((out / "report.json").read_text())
    assert report["exit_code"] == 5 and report["failed_formats"] == [
        {"format": "onnx", "error": crash, "logs": None}]
    assert [row["path"] for row in report["artifacts"]] == ["model.tflite"]
    assert report["artifacts"][0]["ort_optimization_level"] is None
    assert sorted(p.name for p in out.iterdir()) == [
        "model.tflite", "report.html", "report.json", "report.md"]
    left = [p.name for p in (*tmp_path.iterdir(), *(tmp_path / "tmp").iterdir())
            if p.name.startswith(("compressor-", ".out.")) or p.name.endswith(".lock")]
    assert not left, left

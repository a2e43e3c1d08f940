"""Outputs are matched by name (issue 27, items 1, 3b, 9): a two-input Keras model whose
outputs are [cls, aux] while the TFLite converter gives `aux` the lower tensor index. The gate
must score `cls` in every format, `compress eval` must run the multi-input artifacts and print
the report's number, and `compress inspect` must show the signature's names and the batch."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import compressor as cz
from compressor.cli import main
from compressor.runtimes import inspect_artifact, open_runtime
from compressor.config.steps import ValidateConfig
from compressor.tasks.array.evaluate import evaluate_artifact
from support.two_head_models import save_npz, two_head_data, two_head_keras

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("two_head")
    data = two_head_data()
    model = two_head_keras(data)
    xv, yv = data.val
    cls, aux = model([xv["x"], xv["meta"]], training=False)
    heads = {"cls": np.asarray(cls), "aux": np.asarray(aux)}
    result = cz.compress(model, "fp16", data=data, out_dir=folder / "out", latency=False, quiet=True)
    return result, data, heads, folder


def _accuracy(logits, labels) -> float:
    return float(np.mean(np.argmax(logits, axis=1) == labels))


def test_the_tflite_tensor_indices_run_opposite_to_the_outputs(run):
    result, data, heads, _ = run
    from ai_edge_litert.interpreter import Interpreter

    (signature,) = Interpreter(model_path=str(result.artifacts["tflite"]))._get_full_signature_list().values()
    assert signature["outputs"]["cls"] > signature["outputs"]["aux"]   # cls is the model's first
    assert open_runtime(result.artifacts["tflite"]).output_names == ["aux", "cls"]
    # the heads differ: scoring the wrong one shows
    assert _accuracy(heads["cls"], data.val[1]) >= 0.85 and _accuracy(heads["aux"], data.val[1]) <= 0.5


def test_the_gate_scores_the_first_output_by_name_in_every_format(run):
    result, data, heads, _ = run
    keras_cls = _accuracy(heads["cls"], data.val[1])
    assert result.exit_code == 0, result.report["failures"]
    assert result.report["baseline"]["value"] == keras_cls
    for row in result.report["artifacts"]:
        outputs = open_runtime(result.artifacts[row["format"]]).predict(data.val[0])
        assert row["metric_value"] == _accuracy(outputs["cls"], data.val[1]), row["format"]
        assert abs(row["metric_value"] - keras_cls) <= 0.01, row["format"]


def test_an_onnx_file_with_its_outputs_reversed_is_scored_on_the_named_output(run, tmp_path):
    result, data, heads, _ = run
    proto = onnx.load(str(result.artifacts["onnx"]))
    outputs = list(proto.graph.output)
    assert [o.name for o in outputs] == ["cls", "aux"]
    del proto.graph.output[:]
    proto.graph.output.extend(outputs[::-1])
    reversed_path = tmp_path / "reversed.onnx"
    onnx.save(proto, str(reversed_path))
    assert open_runtime(reversed_path).output_names == ["aux", "cls"]
    baseline = result.report["baseline"]["value"]
    for output, head in ((None, "cls"), (1, "aux"), ("aux", "aux")):
        row = evaluate_artifact(reversed_path, data, heads, baseline, ValidateConfig(output=output),
                                latency=False)
        assert abs(row["metric_value"] - _accuracy(heads[head], data.val[1])) <= 0.01, output


@pytest.mark.parametrize("fmt", ["tflite", "onnx"])
def test_eval_runs_a_multi_input_artifact_and_prints_the_reports_number(run, fmt, capsys):
    result, data, _, folder = run
    npz = save_npz(data, folder / "two_head.npz")
    path = str(result.artifacts[fmt])
    assert main(["eval", path, "--data", str(npz), "--output", "cls"]) == 0
    shown = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    row = next(r for r in result.report["artifacts"] if r["format"] == fmt)
    assert (shown["value"], shown["samples"]) == (row["metric_value"], 100)
    # without --output the metric would guess which output: it asks
    assert main(["eval", path, "--data", str(npz)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors == [f"error: model.{fmt} has 2 outputs ({'aux, cls' if fmt == 'tflite' else 'cls, aux'}); "
                      "pass --output NAME: the one the metric reads (a report reads validate.output)"]


def test_inspect_shows_the_signature_names_and_a_dynamic_batch(run, capsys):
    result = run[0]
    assert main(["inspect", str(result.artifacts["tflite"])]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "  input         meta [-1, 2] float32" in lines and "  input         x [-1, 8] float32" in lines
    assert "  output        cls [-1, 4] float32" in lines
    assert "  batch         dynamic (-1): any number of rows per call" in lines


def test_inspect_shows_a_fixed_batch_and_the_renamed_signature(tmp_path, capsys):
    """As litert-torch writes them: tensors `serving_default_args_0:0`, batch 1, the signature
    renamed to the model's input name."""
    import tensorflow as tf

    from compressor.export.tflite import renamed_signature

    class Head(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1, 8], tf.float32, name="args_0")])
        def __call__(self, args_0):
            return {"output_0": tf.matmul(args_0, tf.ones((8, 3)))}

    head = Head()
    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [head.__call__.get_concrete_function()], head)
    path = tmp_path / "fixed.tflite"
    path.write_bytes(renamed_signature(converter.convert(), {"args_0": "input_ids",
                                                             "output_0": "logits"}))
    info = inspect_artifact(path)
    assert info.inputs == [{"name": "input_ids", "shape": [1, 8], "dtype": "float32"}]
    assert info.outputs[0]["name"] == "logits" and info.fixed_batch == 1
    assert main(["inspect", str(path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["fixed_batch"] == 1 and shown["inputs"][0]["name"] == "input_ids"
    assert main(["inspect", str(path)]) == 0
    assert ("  batch         fixed at 1: every call takes exactly 1 row(s); resizing is refused"
            in capsys.readouterr().out.splitlines())

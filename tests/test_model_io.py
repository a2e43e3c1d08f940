"""Models that are not "one float image in, one tensor out" (issue 12): several named inputs,
tuple / dict / ModelOutput outputs, int64 token ids, a Hugging Face model by module:function.
Every artifact is run in its runtime with the inputs fed by name."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import compressor as cz
from compressor.tasks.array.data import digits
from compressor.config.recipe import load_recipe
from compressor.runtimes import inspect_artifact, open_runtime
from support.io_models import (bert_inputs, keras_two_inputs_dict_outputs, token_data,
                       torch_token_transformer, torch_tuple_outputs, torch_two_inputs_dict_outputs,
                       two_input_data)

pytestmark = pytest.mark.slow


def _recipe(base: str, **validate) -> object:
    parent = load_recipe(base)
    return parent.model_copy(update={"name": f"{base}-test", "validation":
                                     parent.validation.model_copy(update=validate)})


def _check_artifacts(result, data, output: str | None, inputs: list[str]) -> None:
    assert result.exit_code == 0, result.report["failures"]
    for row in result.report["artifacts"]:
        assert row["drop"] <= 0.03, row
    for path in result.artifacts.values():
        runtime = open_runtime(path)
        outputs = runtime.predict(data.val[0])      # a dict: fed by name
        chosen = outputs[output] if output else outputs
        accuracy = np.mean(np.argmax(chosen, axis=1) == data.val[1])
        assert accuracy > 0.85, (path.name, accuracy)
        assert len(inspect_artifact(path).inputs) == len(inputs), path.name
        assert _fed_names(path) == sorted(inputs), path.name


def _fed_names(path: Path) -> list[str]:
    """The names an artifact's inputs are fed by: the ONNX graph's input names; for TFLite the
    serving signature's input names (its tensor names carry a prefix: `serving_default_image:0`)."""
    if path.suffix == ".tflite":
        from ai_edge_litert.interpreter import Interpreter

        (signature,) = Interpreter(model_path=str(path)).get_signature_list().values()
        return sorted(signature["inputs"])
    return sorted(i["name"] for i in inspect_artifact(path).inputs)


@pytest.fixture(scope="module")
def torch_two_input():
    data = two_input_data("NCHW")
    return torch_two_inputs_dict_outputs(data), data


@pytest.mark.parametrize("recipe", ["int8", "fp16"])
def test_torch_two_inputs_and_dict_outputs(torch_two_input, recipe, tmp_path):
    model, data = torch_two_input
    result = cz.compress(model, _recipe(recipe, output="logits", max_drop=0.03), data=data, out_dir=tmp_path / "out",
                         latency=False, quiet=True)
    _check_artifacts(result, data, "logits", ["image", "meta"])
    # the baseline read the named output, not the first one (aux, two classes)
    assert result.report["baseline"]["value"] > 0.85


def test_torch_tuple_outputs_int8(tmp_path):
    data = digits("NCHW")
    result = cz.compress(torch_tuple_outputs(data), "int8", data=data, out_dir=tmp_path / "out",
                         latency=False, quiet=True)
    _check_artifacts(result, data, "output_0", ["input"])


@pytest.mark.parametrize("recipe", ["int8", "fp16"])
def test_keras_two_inputs_and_dict_outputs(recipe, tmp_path):
    data = two_input_data("NHWC")
    model = keras_two_inputs_dict_outputs(data)
    result = cz.compress(model, _recipe(recipe, output="logits", max_drop=0.03), data=data, out_dir=tmp_path / "out",
                         latency=False, quiet=True)
    _check_artifacts(result, data, "logits", ["image", "meta"])


def test_torch_transformer_on_int64_ids_fp16(tmp_path):
    """A root-level nn.Parameter must not make the ids float (the old dtype guess did)."""
    data = token_data()
    model = torch_token_transformer(data)
    result = cz.compress(model, "fp16", data=data, out_dir=tmp_path / "out", latency=False, quiet=True)
    assert result.exit_code == 0, result.report["failures"]
    for path in result.artifacts.values():
        for dtype in (np.int64, np.int32):
            ids = data.val[0].astype(dtype)
            accuracy = np.mean(np.argmax(open_runtime(path).predict(ids), 1) == data.val[1])
            assert accuracy >= result.report["baseline"]["value"] - 0.02, (path.name, dtype)


def test_hugging_face_bert_by_module_function(cli, tmp_path):
    """A random-init BertModel (dict outputs, int64 ids, attention_mask) through fp16."""
    train, val = bert_inputs(64), bert_inputs(48, seed=1)
    np.savez(tmp_path / "ids.npz", **{f"x_train.{k}": v for k, v in train.items()},
             **{f"x_val.{k}": v for k, v in val.items()})
    (tmp_path / "fidelity.yaml").write_text(
        "name: fp16_fidelity\nextends: fp16\nvalidate: {metric: fidelity, min_fidelity: 0.999}\n")
    done = cli("--recipe", str(tmp_path / "fidelity.yaml"), "support.io_models:tiny_bert",
               "--data", str(tmp_path / "ids.npz"), "--out", str(tmp_path / "out"),
               cwd=Path(__file__).parent)   # tests/support is importable from there
    assert done.returncode == 0, done.stderr[-2000:]
    import json

    report = json.loads((tmp_path / "out" / "report.json").read_text())
    for row in report["artifacts"]:
        assert row["metric_value"] >= 0.999, row
        # one MAC count for both files, on the data's 16 positions: 2 layers x (q, k, v, out
        # 32x32 + ffn 32x64 x2) x 16 + the pooler 32x32 (ONNX used to lose the batch dim after
        # the attention reshape and count only the first MatMuls: 49,152)
        assert row["macs"] == 2 * 16 * (4 * 32 * 32 + 2 * 32 * 64) + 32 * 32, row
    runtime = open_runtime(tmp_path / "out" / "model.onnx")
    assert runtime.output_names == ["last_hidden_state", "pooler_output"]
    # int8: dynamic (attention, LayerNorm, embeddings), int8 weights in both formats
    (tmp_path / "int8.yaml").write_text(
        "name: int8_fidelity\nextends: int8\nvalidate: {metric: fidelity, min_fidelity: 0.98}\n")
    done = cli("--recipe", str(tmp_path / "int8.yaml"), "support.io_models:tiny_bert",
               "--data", str(tmp_path / "ids.npz"), "--out", str(tmp_path / "int8"),
               cwd=Path(__file__).parent)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "int8" / "report.json").read_text())
    assert report["quantize"]["mode"] == "dynamic"
    for row in report["artifacts"]:
        assert row["metric_value"] >= 0.98 and row["int8_weight_share"] >= 0.9, row
    tflite_macs, onnx_macs = (row["macs"] for row in sorted(report["artifacts"],
                                                             key=lambda r: r["format"] != "tflite"))
    assert abs(onnx_macs - tflite_macs) <= 0.05 * tflite_macs, (onnx_macs, tflite_macs)
    # what the int8 ONNX holds beside its weights (export/onnx_compact.py): no value_info,
    # side parameters as float16, no all-zero weight zero points, the outputs still named
    import onnx

    proto = onnx.load(str(tmp_path / "int8" / "model.onnx"))
    graph = proto.graph
    assert not graph.value_info and [o.name for o in graph.output] == runtime.output_names
    assert sum(i.data_type == onnx.TensorProto.FLOAT16 for i in graph.initializer) >= 10
    assert all(len(n.input) == 3 for n in graph.node if n.op_type == "MatMulInteger")

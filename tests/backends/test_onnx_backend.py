""".onnx input models: a ResNet-style digits net (BatchNorm, skip connection) trained here in
PyTorch and exported with its BatchNorm nodes, compressed through the CLI (int8 static QDQ,
fp16) and through the backend (fallback float layers, dynamic, loading rules). Training
recipes and TFLite are refused before any work; the user's file is never changed."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from support import helpers
import numpy as np
import onnx
import pytest
import torch
from torch import nn

from compressor.backends import backend_for
from compressor.backends.onnx import OnnxBackend
from compressor.core.context import ModelState
from compressor.tasks.array.data import digits
from compressor.errors import ModelLoadError, RecipeError
from compressor.runtimes import inspect_artifact, open_runtime
from compressor.config.steps import PrecisionConfig, QuantizeConfig


class DigitsResNet(nn.Module):
    """conv-BN-ReLU stem, a residual block with BatchNorm, max-pool and a linear head."""

    def __init__(self, channels: int = 16):
        super().__init__()
        c = channels
        self.stem = nn.Sequential(nn.Conv2d(1, c, 3, padding=1, bias=False), nn.BatchNorm2d(c),
                                  nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c),
                                   nn.ReLU(), nn.Conv2d(c, c, 3, padding=1))
        self.head = nn.Sequential(nn.MaxPool2d(2), nn.Flatten(), nn.Linear(c * 16, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        return self.head(torch.relu(x + self.block(x)))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def accuracy(outputs: np.ndarray, labels: np.ndarray) -> float:
    return float((np.asarray(outputs).argmax(1) == labels).mean())


@pytest.fixture(scope="module")
def data():
    return digits("NCHW")


def exported(net: nn.Module, path: Path, data) -> Path:
    """`net` as an fp32 .onnx file (BatchNorm kept as nodes, dynamic batch)."""
    torch.onnx.export(net.eval(), (torch.from_numpy(data.val[0][:2]),), str(path), dynamo=False,
                      input_names=["image"], output_names=["logits"], opset_version=17,
                      dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
                      training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=False)
    assert "BatchNormalization" in {n.op_type for n in onnx.load(str(path)).graph.node}
    return path


@pytest.fixture(scope="module")
def model_file(tmp_path_factory, data) -> Path:
    """The net trained for 3 epochs (about 0.98 val accuracy)."""
    from torch_models import train

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        net = train(DigitsResNet(), data, epochs=3)
    finally:
        torch.set_num_threads(threads)
    return exported(net, tmp_path_factory.mktemp("onnx-model") / "resnet.onnx", data)


@pytest.fixture(scope="module")
def untrained_file(tmp_path_factory, data) -> Path:
    """The same graph untrained: for what needs a valid file but no accuracy."""
    torch.manual_seed(0)
    return exported(DigitsResNet(), tmp_path_factory.mktemp("onnx-untrained") / "net.onnx", data)


@pytest.fixture(scope="module")
def backend():
    return OnnxBackend()


@pytest.fixture(scope="module")
def loaded(backend, model_file):
    return backend.load(str(model_file))


@pytest.fixture(scope="module")
def float_accuracy(backend, loaded, data) -> float:
    value = accuracy(backend.predict(loaded, data.val[0]), data.val[1])
    assert value >= 0.95, "the test model itself must be good for drops to mean anything"
    return value


# --- the CLI -----------------------------------------------------------------------------------

@pytest.mark.slow
def test_int8_cli_gives_int8_weights_within_the_gate_and_leaves_the_file(cli, model_file,
                                                                        tmp_path, float_accuracy):
    before = sha256(model_file)
    done = cli("--recipe", "int8", str(model_file), "--data", "digits", "--out",
               str(tmp_path / "out"), "--no-latency")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "tflite skipped" in done.stdout + done.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "model.onnx", "report.html", "report.json", "report.md"]
    info = inspect_artifact(tmp_path / "out" / "model.onnx")
    assert info.weight_dtypes.get("int8", 0) >= 0.95, info.weight_dtypes
    assert "DequantizeLinear" in info.ops and "BatchNormalization" not in info.ops
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["framework"] == "onnx" and report["passed"]
    assert report["baseline"]["value"] == pytest.approx(float_accuracy)
    assert report["artifacts"][0]["drop"] <= 0.01
    assert sha256(model_file) == before


@pytest.mark.slow
def test_fp16_stores_float16_weights_behind_float32_io(model_file, tmp_path):
    """The Python API, in this process (the CLI runs the same pipeline, see above)."""
    import compressor as cz

    result = cz.compress(str(model_file), "fp16", "digits", out_dir=tmp_path / "out",
                         quiet=True, latency=False)
    assert result.exit_code == 0 and list(result.artifacts) == ["onnx"]
    info = inspect_artifact(result.artifacts["onnx"])
    assert [w.dtype for w in info.weights if w.is_kernel] == ["float16"] * 4
    assert [i["dtype"] for i in info.inputs + info.outputs] == ["float32", "float32"]


@pytest.mark.parametrize("args, expected", [
    (("--recipe", "int8_prune30"), "step 1 `prune` fine-tunes the model"),
    (("--recipe", "int8", "--format", "tflite"), "cannot be exported to tflite"),
])
def test_training_recipes_and_tflite_are_refused_before_any_work(cli, untrained_file, tmp_path,
                                                                  args, expected):
    done = cli(*args, str(untrained_file), "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0], done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "out").exists()


def test_a_corrupt_onnx_file_is_exit_2(cli, untrained_file, tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(untrained_file.read_bytes()[:300])
    done = cli("--recipe", "int8", str(bad), "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert done.stderr.startswith("error:") and "not a valid ONNX model" in done.stderr


# --- the backend -------------------------------------------------------------------------------

def test_describe_and_layout_come_from_the_graph(backend, untrained_file):
    loaded = backend.load(str(untrained_file))
    info = backend.describe(loaded)
    assert [(s.name, s.shape, s.dtype) for s in info.inputs] == [
        ("image", (None, 1, 8, 8), "float32")]
    assert [(s.name, s.shape) for s in info.outputs] == [("logits", (None, 10))]
    assert backend.image_layout == "NCHW"          # 1 channel on axis 1: a torch export
    assert backend_for(str(untrained_file)).name == "onnx"
    assert backend.quantizable_layers(ModelState(model=loaded)) == [
        n.name for n in onnx.load(str(untrained_file)).graph.node if n.op_type in ("Conv", "Gemm")]


def test_an_in_memory_modelproto_predicts_dicts_as_arrays(backend, untrained_file, data):
    loaded = backend.load(str(untrained_file))
    in_memory = backend.load(onnx.load(str(untrained_file)))
    assert in_memory.source is None
    x = data.val[0][:40]
    np.testing.assert_allclose(backend.predict(in_memory, {"image": x}),
                               backend.predict(loaded, x), atol=1e-6)


@pytest.mark.slow
def test_float_layers_stay_float16_and_dynamic_quantizes_weights(backend, loaded, data,
                                                                  tmp_path, float_accuracy):
    ctx = helpers.context(data, tmp_path / "work")
    head = backend.quantizable_layers(ModelState(model=loaded))[-1]
    ptq = QuantizeConfig(mode="ptq", calibration_samples=64, fallback_dtype="float16")
    state = helpers.apply(backend, ModelState(model=backend.clone(loaded), float_layers=(head,)),
                          ptq, ctx)
    path = backend.export(state, "onnx", tmp_path / "mixed.onnx", ctx)
    kernels = [w for w in inspect_artifact(path).weights if w.is_kernel]
    assert sorted(w.dtype for w in kernels) == ["float16", "int8", "int8", "int8"]
    assert accuracy(open_runtime(path).predict(data.val[0]), data.val[1]) >= float_accuracy - 0.01

    dynamic = helpers.apply(backend, ModelState(model=loaded), QuantizeConfig(mode="dynamic"), ctx)
    path = backend.export(dynamic, "onnx", tmp_path / "dynamic.onnx", ctx)
    assert {w.dtype for w in inspect_artifact(path).weights if w.is_kernel} == {"int8"}


def test_training_steps_are_refused_by_the_backend_too(backend, untrained_file, data, tmp_path):
    loaded = backend.load(str(untrained_file))
    ctx = helpers.context(data, tmp_path / "work")
    with pytest.raises(RecipeError, match="does not train: step 1 `quantize` \\(mode qat\\)"):
        helpers.apply(backend, ModelState(model=loaded), QuantizeConfig(mode="qat"), ctx)
    with pytest.raises(RecipeError, match="cannot write tflite"):
        backend.export(helpers.apply(backend, ModelState(model=loaded), PrecisionConfig(), ctx),
                       "tflite", tmp_path / "m.tflite", ctx)


def test_external_data_outside_the_model_folder_is_refused(backend, untrained_file, tmp_path):
    proto = onnx.load(str(untrained_file))
    weight = next(t for t in proto.graph.initializer if t.name.endswith("weight"))
    secret = tmp_path / "secret.bin"
    secret.write_bytes(weight.raw_data)
    weight.ClearField("raw_data")
    weight.data_location = onnx.TensorProto.EXTERNAL
    weight.external_data.add(key="location", value="../secret.bin")
    (tmp_path / "model").mkdir()
    onnx.save(proto, str(tmp_path / "model" / "m.onnx"))
    with pytest.raises(ModelLoadError, match="not a file inside"):
        backend.load(str(tmp_path / "model" / "m.onnx"))
    (tmp_path / "model" / "w.bin").write_bytes(secret.read_bytes())   # beside it: loads
    weight.external_data[0].value = "w.bin"
    onnx.save(proto, str(tmp_path / "model" / "m.onnx"))
    assert backend.describe(backend.load(str(tmp_path / "model" / "m.onnx"))).params > 0


def test_both_post_training_backends_implement_the_backend_protocol():
    import inspect

    from compressor.backends.base import Backend, UserLoopBackend
    from compressor.backends.saved_model import SavedModelBackend

    methods = [name for name, member in vars(Backend).items()
               if inspect.isfunction(member) and not name.startswith("_")]
    for backend in (OnnxBackend, SavedModelBackend):
        assert [name for name in methods if not callable(getattr(backend, name, None))] == []
        assert not isinstance(backend(), UserLoopBackend) and "onnx" in backend().export_formats

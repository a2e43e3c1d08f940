"""quantize fallback: auto — the search (fake backend, exact counts) and the Keras routes on a
model built so that one layer is badly int8-friendly.

The test model's `bottleneck` Dense reads one input unit that is always zero (a dead ReLU
unit of the layer before); its weights from that unit are 500x the largest real weight, in
every output channel. Float outputs do not change, but per-channel int8 scales are set by
the outliers, every real weight of the layer rounds to 0, and full int8 collapses.
"""
from __future__ import annotations

from pathlib import Path

import keras_models as km
import numpy as np
import pytest

from compressor import fallback
from compressor.context import Context, Data, ModelState
from compressor.data import digits
from compressor.errors import RecipeError
from compressor.fallback import Trial
from compressor.passes.quantize import QuantizeConfig, quantize
from compressor.pipeline import compress
from compressor.progress import Progress
from compressor.recipe import ValidateConfig
from compressor.report import render_markdown

slow = pytest.mark.slow
LAYERS = ("conv", "hidden", "bottleneck", "logits")
BASELINE = 0.96


# --- the search, on a fake backend whose accuracy per float-layer set is known ------------

class FakeBackend:
    """Quantize records the float layers; export writes bytes growing with them."""

    name = "fake"

    def __init__(self, layers=LAYERS):
        self.layers = layers

    def quantize_ptq(self, state, config, ctx):
        return state.replace(quantize=config)

    def quantizable_layers(self, state):
        return list(self.layers)

    def export(self, state, fmt, path, ctx):
        Path(path).write_bytes(b"x" * (1000 + 100 * len(state.float_layers)))
        return Path(path)


def fake_accuracy(float_layers):
    """bottleneck costs 0.10 when int8, hidden 0.015, logits 0.002, conv nothing."""
    loss = {"bottleneck": 0.10, "hidden": 0.015, "logits": 0.002, "conv": 0.0}
    return BASELINE - sum(v for k, v in loss.items() if k not in float_layers)


@pytest.fixture
def fake(monkeypatch, tmp_path):
    def evaluate(path, float_layers, ctx):
        value = fake_accuracy(float_layers)
        drop = ctx.baseline_value - value
        return Trial(float_layers, value, drop, fidelity=1.0 - drop,
                     size_bytes=Path(path).stat().st_size, passed=drop <= 0.01 + 1e-12)

    monkeypatch.setattr(fallback, "_evaluate", evaluate)
    x = np.zeros((4, 2), np.float32)
    return Context(data=Data(val=(x, np.zeros(4, np.int64))), backend=FakeBackend(),
                   progress=Progress(quiet=True), workdir=tmp_path / "work",
                   validation=ValidateConfig(max_drop=0.01), reference_outputs=x,
                   baseline_value=BASELINE, formats=("tflite",))


def _run(ctx, **config):
    return quantize(ModelState(model="m"), QuantizeConfig(mode="ptq", fallback="auto", **config),
                    ctx)


def test_search_ranks_layers_and_adds_them_until_the_gate_passes(fake):
    state = _run(fake, max_float_layers=3)
    result = state.fallback
    assert [r.layer for r in result.ranking] == ["bottleneck", "hidden", "logits", "conv"]
    assert result.ranking[0].sensitivity == pytest.approx(0.10)
    # bottleneck alone leaves a 0.017 drop; with hidden, 0.002 passes the 0.01 budget.
    assert state.float_layers == ("bottleneck", "hidden")
    assert result.chosen.passed and result.chosen.drop == pytest.approx(0.002)
    assert result.evaluations == 1 + len(LAYERS) + 1      # full int8, each layer, one more step
    assert result.float_layer_costs() == [("bottleneck", 100), ("hidden", 100)]
    assert not (fake.workdir / "fallback").exists()       # candidates are cleaned up


def test_search_stops_at_max_float_layers_with_the_closest_result(fake):
    state = _run(fake, max_float_layers=1)
    assert state.float_layers == ("bottleneck",)
    assert not state.fallback.chosen.passed
    assert state.fallback.evaluations == 1 + len(LAYERS)


def test_no_search_when_full_int8_passes(fake):
    fake.backend = FakeBackend(layers=("conv",))
    fake.baseline_value = fake_accuracy(())       # int8 loses nothing against this baseline
    state = _run(fake)
    assert state.float_layers == ()
    assert state.fallback.evaluations == 1 and state.fallback.ranking == ()


def test_fallback_report_and_markdown(fake):
    report = _run(fake).fallback.report({})
    assert report["ranking"][0] == {"layer": "bottleneck", "sensitivity": 0.1,
                                    "fidelity_gain": 0.1, "size_cost_bytes": 100}
    assert report["float_layers"] == ["bottleneck", "hidden"] and report["evaluations"] == 6
    markdown = "\n".join(fallback_markdown(report))
    assert "| bottleneck | +0.1000 | +100 B | yes | +100 B |" in markdown
    assert "| conv | +0.0000 | +100 B | no | - |" in markdown


def fallback_markdown(fallback_report):
    base = {"metric": "accuracy", "value": BASELINE, "params": 1, "size_bytes": 4}
    report = {"recipe": {"name": "r", "sha256": "0" * 64}, "passed": True, "failures": [],
              "baseline": base, "framework": "fake", "gate": {"max_drop": 0.01},
              "target": None, "seed": 0, "artifacts": [], "timings_s": {},
              "fallback": fallback_report}
    return render_markdown(report).splitlines()


def test_fallback_refuses_qat_and_runs_without_a_gate(fake):
    with pytest.raises(RecipeError, match="mode: ptq"):
        quantize(ModelState(model="m"), QuantizeConfig(mode="qat", fallback="auto"), fake)
    fake.validation = None
    with pytest.raises(RecipeError, match="accuracy gate"):
        _run(fake)


# --- Keras: TFLite and ONNX artifacts in their runtimes ------------------------------------

def outlier_cnn(data: Data):
    """A trained digits CNN whose `bottleneck` layer is badly int8-friendly (module doc)."""
    keras = km.tf_keras()
    keras.utils.set_random_seed(0)
    layers = keras.layers
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        layers.Conv2D(16, 3, activation="relu", name="conv_a"),
        layers.Conv2D(32, 3, activation="relu", name="conv_b"),
        layers.Flatten(name="flatten"),
        layers.Dense(64, activation="relu", name="dense_hidden"),
        layers.Dense(16, activation="relu", name="bottleneck"),
        layers.Dense(10, name="logits"),
    ], name="outlier_cnn")
    km.train(model, data)
    hidden, bottleneck = model.get_layer("dense_hidden"), model.get_layer("bottleneck")
    kernel, bias = hidden.get_weights()
    kernel[:, 0], bias[0] = 0.0, -1.0                  # unit 0 of dense_hidden: always 0
    hidden.set_weights([kernel, bias])
    kernel, bias = bottleneck.get_weights()
    kernel[0, :] = 500 * np.abs(kernel).max()          # harmless in float: its input is 0
    bottleneck.set_weights([kernel, bias])
    return model


@pytest.fixture(scope="module")
def keras_runs(tmp_path_factory):
    from compressor.backends.keras_backend import KerasBackend

    data = digits("NHWC")
    model = outlier_cnn(data)
    folder = tmp_path_factory.mktemp("fallback")
    ctx = km.keras_context(data, folder / "work")
    fp32 = {fmt: KerasBackend().export(ModelState(model=model), fmt, folder / f"fp32.{fmt}", ctx)
            for fmt in ("tflite", "onnx")}
    options = {"quiet": True, "latency": False}
    return {"model": model, "data": data, "ctx": ctx, "folder": folder,
            "fp32_bytes": {fmt: path.stat().st_size for fmt, path in fp32.items()},
            "int8": compress(model, "int8", data, out_dir=folder / "int8", **options),
            "mixed": compress(model, "mixed_int8_fp16", data, out_dir=folder / "mixed", **options)}


@slow
def test_keras_plain_int8_misses_a_one_point_budget(keras_runs):
    result = keras_runs["int8"]
    assert result.report["baseline"]["value"] >= 0.95
    assert result.exit_code == 3
    for row in result.report["artifacts"]:
        assert row["drop"] > 0.5, row             # the outliers wipe out the layer


@slow
def test_keras_mixed_int8_fp16_keeps_the_outlier_layer_float(keras_runs):
    result = keras_runs["mixed"]
    report = result.report
    assert result.exit_code == 0, report["failures"]
    found = report["fallback"]
    assert found["ranking"][0]["layer"] == "bottleneck"
    assert found["ranking"][0]["sensitivity"] > 0.5
    floats = found["float_layers"]
    assert floats[0] == "bottleneck" and len(floats) <= 2, floats
    quantizable = 5
    assert found["evaluations"] == 1 + quantizable + len(floats) - 1  # full, each layer, steps
    assert found["float_weight_dtypes"] == {"tflite": ["float16"], "onnx": ["float16"]}
    for row in report["artifacts"]:
        assert row["drop"] <= 0.01, row
        assert row["size_bytes"] <= 0.45 * keras_runs["fp32_bytes"][row["format"]], row
        assert row["weight_dtypes"]["int8"] > 0.9
    markdown = (result.out_dir / "report.md").read_text()
    assert "## int8 fallback" in markdown
    cost = found["float_layer_costs"][0]["size_cost_bytes"]
    assert f"| bottleneck | +{found['ranking'][0]['sensitivity']:.4f} |" in markdown
    assert f"| yes | {cost:+,} B |" in markdown and 0 < cost < 4 * 64 * 16


@slow
def test_keras_float32_fallback_layers_in_both_formats(keras_runs):
    """fallback_dtype: float32 keeps the layer's weights float32 in TFLite and ONNX."""
    from compressor.runtimes import inspect_artifact

    ctx, data = keras_runs["ctx"], keras_runs["data"]
    config = QuantizeConfig(mode="ptq", fallback="auto", fallback_dtype="float32")
    state = ModelState(model=keras_runs["model"], quantize=config, float_layers=("bottleneck",))
    for fmt in ("tflite", "onnx"):
        path = ctx.backend.export(state, fmt, keras_runs["folder"] / f"fp32_layer.{fmt}", ctx)
        kernels = [w.dtype for w in inspect_artifact(path).weights if w.is_kernel]
        assert sorted(kernels) == ["float32", "int8", "int8", "int8", "int8"], (fmt, kernels)
        run = km.run_tflite if fmt == "tflite" else km.run_onnx
        accuracy = km.accuracy(run(path, np.asarray(data.val[0])), data.val[1])
        assert keras_runs["mixed"].report["baseline"]["value"] - accuracy <= 0.01, fmt


# --- PyTorch: the same model shape, PT2E leaving the module float -------------------------

def outlier_torch_net(data: Data):
    """The PyTorch twin of `outlier_cnn` (NCHW), trained briefly, bottleneck made unfriendly."""
    import torch
    import torch_models as tm
    from torch import nn

    class OutlierNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
                                          nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                                          nn.MaxPool2d(2))
            self.hidden, self.bottleneck = nn.Linear(512, 64), nn.Linear(64, 16)
            self.logits = nn.Linear(16, 10)

        def forward(self, x):
            x = torch.relu(self.hidden(torch.flatten(self.features(x), 1)))
            return self.logits(torch.relu(self.bottleneck(x)))

    torch.manual_seed(0)
    model = tm.train(OutlierNet(), data, epochs=4)
    with torch.no_grad():
        model.hidden.weight[0], model.hidden.bias[0] = 0.0, -1.0    # unit 0: always 0
        model.bottleneck.weight[:, 0] = 500 * model.bottleneck.weight.abs().max()
    return model


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory):
    import torch_models as tm

    from compressor.recipe import load_recipe

    data = digits("NCHW")
    model = outlier_torch_net(data)
    folder = tmp_path_factory.mktemp("fallback_torch")
    ctx = tm.torch_context(data, folder / "work")
    fp32 = {fmt: ctx.backend.export(ModelState(model=model), fmt, folder / f"fp32.{fmt}", ctx)
            for fmt in ("tflite", "onnx")}
    recipe = load_recipe("mixed_int8_fp16").model_copy(update={"export": ("onnx",)})
    result = compress(model, recipe, data, out_dir=folder / "mixed", quiet=True, latency=False)
    return {"model": model, "data": data, "ctx": ctx, "folder": folder, "result": result,
            "fp32_bytes": {fmt: path.stat().st_size for fmt, path in fp32.items()}}


@slow
def test_torch_onnx_mixed_int8_fp16_keeps_the_outlier_layer_float(torch_run):
    report = torch_run["result"].report
    found = report["fallback"]
    assert found["full_int8"]["drop"] > 0.5         # plain int8 misses the 1-point budget
    assert torch_run["result"].exit_code == 0, report["failures"]
    assert found["ranking"][0]["layer"] == "bottleneck"
    # bottleneck first; a briefly trained net may need one more layer float for a 1-pt budget
    floats = found["float_layers"]
    assert floats[0] == "bottleneck" and len(floats) <= 2, floats
    assert found["evaluations"] == 1 + 5 + len(floats) - 1   # full int8, each layer, steps
    assert found["float_weight_dtypes"] == {"onnx": ["float16"]}
    (row,) = report["artifacts"]
    assert row["drop"] <= 0.01 and row["size_bytes"] <= 0.45 * torch_run["fp32_bytes"]["onnx"]


@slow
def test_torch_tflite_keeps_the_chosen_layer_float16(torch_run):
    """The litert-torch route honours float_layers too (the search itself is format-blind)."""
    import keras_models as km

    ctx, data = torch_run["ctx"], torch_run["data"]
    floats = tuple(torch_run["result"].report["fallback"]["float_layers"])
    config = QuantizeConfig(mode="ptq", fallback="auto", fallback_dtype="float16")
    state = ctx.backend.quantize_ptq(ModelState(model=torch_run["model"], float_layers=floats),
                                     config, ctx)
    path = ctx.backend.export(state, "tflite", torch_run["folder"] / "mixed.tflite", ctx)
    from compressor.runtimes import inspect_artifact, open_runtime

    kernels = [w.dtype for w in inspect_artifact(path).weights if w.is_kernel]
    assert kernels.count("float16") == len(floats) and kernels.count("int8") == 5 - len(floats)
    outputs = open_runtime(path).predict(np.asarray(data.val[0]))   # batch-1 artifact
    accuracy = km.accuracy(outputs, data.val[1])
    baseline = torch_run["result"].report["baseline"]["value"]
    assert baseline - accuracy <= 0.01
    assert path.stat().st_size <= 0.45 * torch_run["fp32_bytes"]["tflite"]

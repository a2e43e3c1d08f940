"""precision pass: float16 artifacts (TFLite, ONNX) with float32 I/O, `exclude`d layers kept in
float32, and bfloat16 refused per format with the reason. Every number is read back from the
artifact files or measured in LiteRT / onnxruntime."""
from __future__ import annotations

from pathlib import Path

import keras_models as km
import numpy as np
import pytest

from compressor.context import Context, Data, ModelState
from compressor.data import digits
from compressor.errors import BackendUnavailableError, RecipeError
from compressor.passes.precision import PrecisionConfig, precision
from compressor.pipeline import compress
from compressor.progress import Progress
from compressor.recipe import recipe_from_dict
from compressor.runtimes import inspect_artifact

slow = pytest.mark.slow
FORMATS = ("tflite", "onnx")


def kernel_dtypes(path: Path) -> list[str]:
    """dtype of each conv / dense weight as stored, in the file's tensor order."""
    return [w.dtype for w in inspect_artifact(path).weights if w.is_kernel]


# --- bfloat16: no format can deliver it; the error names the format and why ---------------

@pytest.mark.parametrize("formats, reason", [
    (("onnx",), "no bfloat16 MatMul / Gemm / Conv kernels"),
    (("tflite",), "TFLite has no bfloat16 weight type"),
])
def test_bfloat16_is_refused_per_format_with_exit_2(tmp_path, formats, reason):
    ctx = Context(data=Data(), backend=None, progress=Progress(quiet=True), workdir=tmp_path,
                  formats=formats)
    with pytest.raises(BackendUnavailableError, match=reason) as caught:
        precision(ModelState(model=None), PrecisionConfig(dtype="bfloat16"), ctx)
    assert f"{formats[0]}:" in str(caught.value) and "use dtype: float16" in str(caught.value)
    assert caught.value.exit_code == 2


def test_bfloat16_with_tflite_export_fails_at_recipe_load(tmp_path, cli):
    recipe = tmp_path / "bf16.yaml"
    recipe.write_text("name: bf16\nsteps:\n  - pass: precision\n    dtype: bfloat16\n"
                      "export: [tflite, onnx]\n")
    run = cli("--recipe", str(recipe), str(tmp_path / "model.keras"), "--out",
              str(tmp_path / "out"))
    assert run.returncode == 2, run.stderr
    assert "TFLite cannot store bfloat16" in run.stderr


# --- float16 artifacts on a trained digits CNN -----------------------------------------------

@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from compressor.backends.keras_backend import KerasBackend

    data = digits("NHWC")
    model = km.train(km.digits_cnn(), data)
    folder = tmp_path_factory.mktemp("precision")
    ctx = km.keras_context(data, folder / "work")
    fp32 = {fmt: KerasBackend().export(ModelState(model=model), fmt, folder / f"fp32.{fmt}", ctx)
            for fmt in FORMATS}
    head = model.layers[-1].name          # Keras numbers layer names per process: read it
    excluding = recipe_from_dict({"name": "fp16_but_head", "steps": [
        {"pass": "precision", "dtype": "float16", "exclude": [head]}],
        "validate": {"max_drop": 0.005}})
    options = {"quiet": True, "latency": False}
    return {"model": model, "data": data, "ctx": ctx, "head": head,
            "fp32_bytes": {fmt: path.stat().st_size for fmt, path in fp32.items()},
            "fp16": compress(model, "fp16", data, out_dir=folder / "fp16", **options),
            "excluding": compress(model, excluding, data, out_dir=folder / "excl", **options)}


@slow
def test_fp16_artifacts_halve_the_size_within_half_a_point(runs):
    result = runs["fp16"]
    assert result.exit_code == 0, result.report["failures"]
    for row in result.report["artifacts"]:
        path = result.artifacts[row["format"]]
        assert set(kernel_dtypes(path)) == {"float16"}, row
        assert row["size_bytes"] <= 0.55 * runs["fp32_bytes"][row["format"]], row
        assert row["drop"] <= 0.005, row
        info = inspect_artifact(path)
        assert [io["dtype"] for io in info.inputs + info.outputs] == ["float32", "float32"]


@slow
def test_excluded_layer_stays_float32_in_both_formats(runs):
    result = runs["excluding"]
    assert result.exit_code == 0, result.report["failures"]
    for fmt, path in result.artifacts.items():
        dtypes = kernel_dtypes(path)
        # digits_cnn: conv, conv, dense, head; only the head's kernel is float32
        assert sorted(dtypes) == ["float16", "float16", "float16", "float32"], (fmt, dtypes)
        head = [w for w in inspect_artifact(path).weights if w.is_kernel and w.dtype == "float32"]
        assert head[0].shape in ((64, 10), (10, 64)), (fmt, head[0].shape)
    for row in result.report["artifacts"]:
        assert row["drop"] <= 0.005, row
        assert row["size_bytes"] <= 0.56 * runs["fp32_bytes"][row["format"]], row


@slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_exclude_pattern_that_matches_nothing_is_refused(runs, tmp_path, fmt):
    state = ModelState(model=runs["model"], precision=PrecisionConfig(exclude=("no_such*",)))
    with pytest.raises(RecipeError, match="no_such"):
        runs["ctx"].backend.export(state, fmt, tmp_path / f"m.{fmt}", runs["ctx"])


@slow
def test_outputs_agree_with_float32(runs):
    """The fp16 artifacts' logits stay close to the Keras model's, row by row."""
    x = np.asarray(runs["data"].val[0][:64])
    reference = runs["model"](x, training=False).numpy()
    artifacts = runs["fp16"].artifacts
    for outputs in (km.run_tflite(artifacts["tflite"], x), km.run_onnx(artifacts["onnx"], x)):
        assert np.abs(outputs - reference).max() < 0.05 * np.abs(reference).max()


# --- PyTorch: the same through torch.onnx, `exclude` naming module paths -------------------

@pytest.fixture(scope="module")
def torch_runs(tmp_path_factory):
    import torch_models as tm

    data = digits("NCHW")
    model = tm.train(tm.digits_cnn(), data, epochs=4)
    folder = tmp_path_factory.mktemp("precision_torch")
    ctx = tm.torch_context(data, folder / "work")
    fp32 = ctx.backend.export(ModelState(model=model), "onnx", folder / "fp32.onnx", ctx)
    recipe = recipe_from_dict({"name": "fp16_but_head", "export": ["onnx"], "steps": [
        {"pass": "precision", "dtype": "float16", "exclude": ["head.3"]}],
        "validate": {"max_drop": 0.005}})
    options = {"quiet": True, "latency": False}
    return {"model": model, "ctx": ctx, "fp32_bytes": fp32.stat().st_size,
            "excluding": compress(model, recipe, data, out_dir=folder / "excl", **options)}


@slow
def test_torch_onnx_fp16_keeps_the_excluded_module_float32(torch_runs):
    result = torch_runs["excluding"]
    assert result.exit_code == 0, result.report["failures"]
    (row,) = result.report["artifacts"]
    assert row["drop"] <= 0.005 and row["size_bytes"] <= 0.56 * torch_runs["fp32_bytes"], row
    kernels = [w for w in inspect_artifact(result.artifacts["onnx"]).weights if w.is_kernel]
    assert sorted(w.dtype for w in kernels) == ["float16", "float16", "float16", "float32"]
    (head,) = [w for w in kernels if w.dtype == "float32"]
    assert 10 in head.shape and 64 in head.shape      # head.3: Linear(64, 10)


@slow
def test_torch_tflite_exclude_is_refused_with_the_reason(torch_runs, tmp_path):
    state = ModelState(model=torch_runs["model"], precision=PrecisionConfig(exclude=("head.3",)))
    with pytest.raises(BackendUnavailableError, match="cannot keep chosen layers in float32"):
        torch_runs["ctx"].backend.export(state, "tflite", tmp_path / "m.tflite", torch_runs["ctx"])

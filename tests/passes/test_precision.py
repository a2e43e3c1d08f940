"""precision pass: float16 artifacts (TFLite, ONNX) with float32 I/O, `exclude`d layers kept in
float32, and bfloat16 refused per format with the reason; both backends (tests/support/backend_kits.py).
Every number is read back from the artifact files or measured in LiteRT / onnxruntime."""
from __future__ import annotations

from support import helpers
import numpy as np
import pytest
from support.artifact_checks import export_both, kernel_dtypes, run

from compressor.core.context import ModelState
from compressor.errors import BackendUnavailableError, RecipeError
from compressor.run.pipeline import compress
from compressor.config.recipe import recipe_from_dict
from compressor.runtimes import inspect_artifact
from compressor.schemes import Float16
from compressor.config.steps import PrecisionConfig

slow = pytest.mark.slow
FORMATS = ("tflite", "onnx")
# litert-torch converts float16 for the whole model or not at all: no `exclude` there.
EXCLUDE_FORMATS = {"keras": ("tflite", "onnx"), "torch": ("onnx",)}


# --- bfloat16: no format can deliver it; the error names the format and why ---------------

@pytest.mark.parametrize("formats, reason", [
    (("onnx",), "no bfloat16 MatMul / Gemm / Conv kernels"),
    (("tflite",), "TFLite has no bfloat16 weight type"),
])
def test_bfloat16_is_refused_per_format_with_exit_2(tmp_path, formats, reason):
    ctx = helpers.context(workdir=tmp_path, formats=formats)
    with pytest.raises(BackendUnavailableError, match=reason) as caught:
        helpers.apply(None, ModelState(model=None), PrecisionConfig(dtype="bfloat16"), ctx)
    assert f"{formats[0]}:" in str(caught.value) and "use dtype: float16" in str(caught.value)
    assert caught.value.exit_code == 2


def test_bfloat16_with_tflite_export_fails_at_recipe_load(tmp_path, cli):
    recipe = tmp_path / "bf16.yaml"
    recipe.write_text("name: bf16\nsteps:\n  - pass: precision\n    dtype: bfloat16\n"
                      "export: [tflite, onnx]\n")
    run_ = cli("--recipe", str(recipe), str(tmp_path / "model.keras"), "--out",
               str(tmp_path / "out"))
    assert run_.returncode == 2, run_.stderr
    assert "TFLite cannot store bfloat16" in run_.stderr


# --- float16 artifacts of a trained digits CNN, both backends ------------------------------

@pytest.fixture(scope="module")
def runs(kit, tmp_path_factory):
    model = kit.trained_cnn()
    folder = tmp_path_factory.mktemp(f"precision_{kit.name}")
    ctx = kit.context(None, folder / "work")
    fp32 = export_both(kit.backend, ModelState(model=model), ctx, folder / "fp32")
    excluding = recipe_from_dict({"name": "fp16_but_head", "steps": [
        {"pass": "precision", "dtype": "float16", "exclude": [kit.head_name(model)]}],
        "export": list(EXCLUDE_FORMATS[kit.name]), "validate": {"max_drop": 0.005}})
    options = {"quiet": True, "latency": False}
    return {"kit": kit, "model": model, "ctx": ctx,
           "fp32_bytes": {fmt: path.stat().st_size for fmt, path in fp32.items()},
           "fp16": compress(model, "fp16", kit.data, out_dir=folder / "fp16", **options),
           "excluding": compress(model, excluding, kit.data, out_dir=folder / "excl", **options)}


@slow
def test_fp16_artifacts_halve_the_size_within_half_a_point(runs):
    result = runs["fp16"]
    assert result.exit_code == 0, result.report["failures"]
    assert len(result.report["artifacts"]) == len(FORMATS)
    for row in result.report["artifacts"]:
        path = result.artifacts[row["format"]]
        assert set(kernel_dtypes(path)) == {"float16"}, row
        assert row["size_bytes"] <= 0.55 * runs["fp32_bytes"][row["format"]], row
        assert row["drop"] <= 0.005, row
        info = inspect_artifact(path)
        assert [io["dtype"] for io in info.inputs + info.outputs] == ["float32", "float32"]


@slow
def test_excluded_layer_stays_float32(runs):
    result = runs["excluding"]
    assert result.exit_code == 0, result.report["failures"]
    assert sorted(result.artifacts) == sorted(EXCLUDE_FORMATS[runs["kit"].name])
    for fmt, path in result.artifacts.items():
        dtypes = kernel_dtypes(path)
        # digits CNN: conv, conv, dense, head; only the head's kernel is float32
        assert sorted(dtypes) == ["float16", "float16", "float16", "float32"], (fmt, dtypes)
        (head,) = [w for w in inspect_artifact(path).weights
                   if w.is_kernel and w.dtype == "float32"]
        assert head.shape in ((64, 10), (10, 64)), (fmt, head.shape)
    for row in result.report["artifacts"]:
        assert row["drop"] <= 0.005, row
        assert row["size_bytes"] <= 0.56 * runs["fp32_bytes"][row["format"]], row


@slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_exclude_is_refused_when_it_names_nothing_or_the_format_cannot(runs, tmp_path, fmt):
    kit, ctx = runs["kit"], runs["ctx"]
    step = PrecisionConfig(exclude=("no_such*",))
    state = ModelState(model=runs["model"], steps=(step,), scheme=Float16.from_step(step))
    if fmt in EXCLUDE_FORMATS[kit.name]:
        expected = pytest.raises(RecipeError, match="no_such")
    else:
        expected = pytest.raises(BackendUnavailableError,
                                 match="cannot keep chosen layers in float32")
    with expected:
        kit.backend.export(state, fmt, tmp_path / f"m.{fmt}", ctx)


@slow
def test_outputs_agree_with_float32(runs):
    """The fp16 artifacts' logits stay close to the model's, row by row."""
    kit = runs["kit"]
    x = np.asarray(kit.data.val[0][:64])
    reference = kit.backend.predict(runs["model"], x)
    for path in runs["fp16"].artifacts.values():
        outputs = run(path, x)
        assert np.abs(outputs - reference).max() < 0.05 * np.abs(reference).max(), path.name

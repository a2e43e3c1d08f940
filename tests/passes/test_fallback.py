"""quantize fallback: auto on real models, both backends (kits in tests/support/backend_kits.py).

The model's `bottleneck` dense layer reads one input unit that is always zero (a dead ReLU
unit of the layer before); its weights from that unit are 500x the largest real weight, in
every output channel. Float outputs do not change, but per-channel int8 scales are set by the
outliers, every real weight of the layer rounds to 0, and full int8 collapses. The search
must find that layer and keep it float, in every format, read back from the files.
"""
from __future__ import annotations

import pytest
from support.artifact_checks import accuracy, export_both, kernel_dtypes
from support.html_checks import check_report_html

from compressor.core.context import ModelState
from compressor.errors import AccuracyGateError
from compressor.run.pipeline import compress
from compressor.schemes import Int8Static, apply_scheme
from compressor.config.steps import QuantizeConfig

slow = pytest.mark.slow
QUANTIZABLE = 5   # conv_a / conv_b (features), hidden, bottleneck, logits
# The search measures candidates in the recipe's first format; converting through
# litert-torch costs ~10 s a candidate, so the PyTorch search measures ONNX only.
SEARCH_FORMATS = {"keras": ("tflite", "onnx"), "torch": ("onnx",)}


@pytest.fixture(scope="module")
def runs(kit, tmp_path_factory):
    model = kit.outlier_model()
    folder = tmp_path_factory.mktemp(f"fallback_{kit.name}")
    ctx = kit.context(None, folder / "work")
    fp32 = export_both(kit.backend, ModelState(model=model), ctx, folder / "fp32")
    formats = SEARCH_FORMATS[kit.name]
    options = {"quiet": True, "latency": False, "formats": formats}
    return {"kit": kit, "model": model, "ctx": ctx, "folder": folder, "formats": formats,
           "fp32_bytes": {fmt: path.stat().st_size for fmt, path in fp32.items()},
           "int8": compress(model, "int8", kit.data, out_dir=folder / "int8", **options),
           "mixed": compress(model, "mixed_int8_fp16", kit.data, out_dir=folder / "mixed",
                             **options)}


@slow
def test_plain_int8_misses_a_one_point_budget(runs):
    result = runs["int8"]
    assert result.report["baseline"]["value"] >= 0.95
    assert result.exit_code == 3
    for row in result.report["artifacts"]:
        assert row["drop"] > 0.5, row             # the outliers wipe out the layer
    missed = r"accuracy 0\.\d+ drops by 0\.\d+ \(from 0\.\d+\) > max_drop 0\.01"
    with pytest.raises(AccuracyGateError, match=missed) as caught:
        result.check()
    assert caught.value.exit_code == 3 and str(result.out_dir) in str(caught.value)


@slow
def test_mixed_int8_fp16_keeps_the_outlier_layer_float16(runs):
    result = runs["mixed"]
    report = result.report
    assert result.exit_code == 0, report["failures"]
    found = report["fallback"]
    assert found["full_int8"]["drop"] > 0.5
    assert found["ranking"][0]["layer"] == "bottleneck"
    assert found["ranking"][0]["sensitivity"] > 0.5
    # bottleneck first; a briefly trained net may need one more layer float for a 1-pt budget
    floats = found["float_layers"]
    assert floats[0] == "bottleneck" and len(floats) <= 2, floats
    assert found["evaluations"] == 1 + QUANTIZABLE + len(floats) - 1  # full, each layer, steps
    assert found["float_weight_dtypes"] == {fmt: ["float16"] for fmt in runs["formats"]}
    for row in report["artifacts"]:
        assert row["drop"] <= 0.01, row
        assert row["size_bytes"] <= 0.45 * runs["fp32_bytes"][row["format"]], row
        assert row["weight_dtypes"]["int8"] > 0.9
    markdown = (result.out_dir / "report.md").read_text()
    assert "## int8 fallback" in markdown
    cost = found["float_layer_costs"][0]["size_cost_bytes"]
    assert f"| bottleneck | +{found['ranking'][0]['sensitivity']:.4f} |" in markdown
    assert f"| yes | {cost:+,} B |" in markdown and 0 < cost < 4 * 64 * 16
    page = check_report_html(result.out_dir)   # the ranking, kept float per layer
    assert page.column("fallback", "bottleneck", "kept float") == "true"
    assert float(page.column("fallback", "bottleneck", "size cost in the artifact")) == cost


@slow
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_fallback_layers_keep_their_dtype_in_every_format(runs, dtype):
    """The search is format-blind: each exporter honours `float_layers` and `fallback_dtype`."""
    kit, ctx = runs["kit"], runs["ctx"]
    floats = tuple(runs["mixed"].report["fallback"]["float_layers"])
    config = QuantizeConfig(mode="ptq", fallback="auto", fallback_dtype=dtype)
    state = apply_scheme(kit.backend, ModelState(model=runs["model"], float_layers=floats),
                         Int8Static.from_step(config), ctx).after(config)
    artifacts = export_both(kit.backend, state, ctx, runs["folder"] / f"float_layers_{dtype}")
    baseline = runs["mixed"].report["baseline"]["value"]
    for fmt, path in artifacts.items():
        expected = [dtype] * len(floats) + ["int8"] * (QUANTIZABLE - len(floats))
        assert sorted(kernel_dtypes(path)) == sorted(expected), fmt
        assert baseline - accuracy(path, kit.data) <= 0.01, fmt

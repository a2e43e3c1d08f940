"""`compress` end to end, one suite for both backends: real artifacts, read back and run.

Acceptance of the Keras slice (issue 2) and the PyTorch path (issue 3): int8_prune30 within
0.01 in LiteRT and onnxruntime, int8 kernels with >= 28% zeros read back from both files, the
size ratios vs fp32, fp16 halving; plus the gate (exit 3) and device budget (exit 4) outcomes.
"""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import yaml

from compressor.cli import main as compress_main
from compressor.run.pipeline import compress
from compressor.runtimes import inspect_artifact
from support import browser, html_checks
from support.models import BACKENDS, cli_args, saved_digits_model

pytestmark = pytest.mark.slow

FP32_RECIPE = {"name": "fp32", "steps": [], "export": ["tflite", "onnx"],
               "validate": {"metric": "accuracy", "max_drop": 0.0}}


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request):
    return request.param


@pytest.fixture(scope="module")
def model(backend, tmp_path_factory):
    return saved_digits_model(backend, tmp_path_factory.mktemp(f"{backend}-model"))


@pytest.fixture(scope="module")
def runs(backend, model, tmp_path_factory):
    """fp32, int8_prune30 and fp16 runs of the same model, shared by the assertions below."""
    ref, options = model
    folder = tmp_path_factory.mktemp(f"{backend}-runs")
    fp32_recipe = folder / "fp32.yaml"
    fp32_recipe.write_text(yaml.safe_dump(FP32_RECIPE))
    return {name: compress(ref, recipe, "digits", out_dir=folder / name, quiet=True,
                           latency=False, **options)
            for name, recipe in (("fp32", str(fp32_recipe)), ("int8_prune30", "int8_prune30"),
                                 ("fp16", "fp16"))}


def _artifact(result, fmt):
    return next(a for a in result.report["artifacts"] if a["format"] == fmt)


@pytest.mark.parametrize("fmt", ["tflite", "onnx"])
def test_int8_prune30_keeps_accuracy_in_the_real_runtime(runs, fmt):
    result = runs["int8_prune30"]
    assert result.passed and result.exit_code == 0
    art = _artifact(result, fmt)
    assert art["drop"] <= 0.01, art
    assert art["metric_value"] >= 0.9


@pytest.mark.parametrize("fmt", ["tflite", "onnx"])
def test_int8_prune30_kernels_are_int8_and_sparse_in_the_file(runs, fmt):
    info = inspect_artifact(runs["int8_prune30"].artifacts[fmt])
    kernels = [w for w in info.weights if w.is_kernel]
    assert len(kernels) >= 4   # two convs, two dense layers
    assert {w.dtype for w in kernels} == {"int8"}, [(w.name, w.dtype) for w in kernels]
    zeros = sum(w.zeros for w in kernels) / sum(w.size for w in kernels)
    assert zeros >= 0.28
    assert info.sparsity == pytest.approx(zeros)


def test_int8_prune30_size_against_fp32(runs, backend):
    fp32 = runs["fp32"].report["artifacts"]
    int8 = runs["int8_prune30"].report["artifacts"]
    sizes = {a["format"]: a["size_bytes"] for a in fp32}
    tflite_ratio = _artifact(runs["int8_prune30"], "tflite")["size_bytes"] / sizes["tflite"]
    onnx_ratio = _artifact(runs["int8_prune30"], "onnx")["size_bytes"] / sizes["onnx"]
    assert tflite_ratio <= 0.30, tflite_ratio
    assert onnx_ratio <= 0.35, onnx_ratio
    gzip_fp32 = {a["format"]: a["gzip_bytes"] for a in fp32}
    assert all(a["gzip_bytes"] < gzip_fp32[a["format"]] * 0.3 for a in int8)


@pytest.mark.parametrize("fmt", ["tflite", "onnx"])
def test_fp16_halves_the_file_and_keeps_accuracy(runs, fmt):
    art = _artifact(runs["fp16"], fmt)
    fp32 = _artifact(runs["fp32"], fmt)
    info = inspect_artifact(runs["fp16"].artifacts[fmt])
    assert {w.dtype for w in info.weights if w.is_kernel} == {"float16"}
    assert art["size_bytes"] <= 0.55 * fp32["size_bytes"]
    assert art["drop"] <= 0.005


def test_report_has_every_contract_key_and_matches_inspect(runs, cli):
    result = runs["int8_prune30"]
    report = json.loads((result.out_dir / "report.json").read_text())
    assert {"recipe", "seed", "target", "baseline", "artifacts", "gate", "timings_s",
            "versions"} <= set(report)
    assert set(report["recipe"]) >= {"name", "sha256"} and report["recipe"]["name"] == "int8_prune30"
    assert set(report["baseline"]) >= {"metric", "value", "size_bytes", "params"}
    for art in report["artifacts"]:
        assert {"format", "path", "size_bytes", "gzip_bytes", "sha256", "metric_value", "drop",
                "sparsity", "weight_dtypes", "latency_ms_p50", "est_peak_memory_bytes",
                "fits_target"} <= set(art)
        shown = json.loads(cli("inspect", str(result.out_dir / art["path"]), "--json").stdout)
        for key in ("size_bytes", "gzip_bytes", "sha256", "sparsity", "weight_dtypes",
                    "est_peak_memory_bytes"):
            assert shown[key] == art[key], key
    assert (result.out_dir / "report.md").read_text().count("| model.") == 2
    page = html_checks.check_report_html(result.out_dir)   # the same numbers in report.html
    assert {"sizes", "metric", "tensors", "history"} <= set(page.sections)


def test_failed_gate_exits_3_and_still_leaves_artifacts(model, cli, tmp_path):
    """90% one-shot pruning with no fine-tuning and a zero-drop gate cannot pass."""
    ref, options = model
    recipe = tmp_path / "harsh.yaml"
    recipe.write_text(yaml.safe_dump({"name": "harsh", "export": ["onnx"],
                                      "steps": [{"pass": "prune", "sparsity": 0.9, "epochs": 0}],
                                      "validate": {"max_drop": 0.0}}))
    out = tmp_path / "out"
    result = cli("--recipe", str(recipe), ref, *cli_args(options), "--out", str(out), "--no-latency")
    assert result.returncode == 3, result.stderr
    assert "drop" in result.stderr and "Traceback" not in result.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["passed"] is False and report["gate"]["passed"] is False
    assert report["artifacts"][0]["drop"] > 0.0
    assert (out / "model.onnx").is_file() and (out / "report.md").is_file()
    page = html_checks.check_report_html(out)   # the verdict first: FAILED, the gate named
    assert page.verdict["class"] == "verdict failed" and page.verdict["data-exit-code"] == "3"
    # `compress report` writes both files again from report.json alone, byte for byte
    written = {name: (out / name).read_bytes() for name in ("report.md", "report.html")}
    for name in written:
        (out / name).unlink()
    assert compress_main(["report", str(out)]) == 0   # in this process: no interpreter start
    assert {name: (out / name).read_bytes() for name in written} == written


def test_report_and_sweep_pages_in_headless_chromium(runs, backend, tmp_path):
    """Both pages load from file:// with no console error and no request but the page itself,
    draw something (not a blank screenshot) and fit a 390 px phone screen without sideways
    scrolling. The sweep page is made from this module's fp32 / int8_prune30 / fp16 runs.
    Keras only: the pages are framework-free (the PyTorch ones are parsed above).
    COMPRESSOR_SCREENSHOTS=DIR copies the screenshots there (docs/ for the README)."""
    if backend != "keras":
        pytest.skip("the pages do not depend on the framework: the Keras run's are opened")
    import pandas as pd

    from compressor.report.html.sweep_page import render_sweep
    from compressor.run.sweep import _rows

    binary = browser.chromium_or_skip()
    folder = runs["fp32"].out_dir.parent
    frame = pd.DataFrame([row for result in runs.values()
                          for row in _rows(result.report, cached=False)]).assign(error=None)
    (folder / "sweep.html").write_text(render_sweep(frame, folder))
    html_checks.check_sweep_html(folder / "sweep.html", frame)
    pages = {"report": (runs["int8_prune30"].out_dir / "report.html", 1400),
             "sweep": (folder / "sweep.html", 950)}
    with browser.Chromium(binary) as chromium:
        for name, (path, height) in pages.items():
            url = path.resolve().as_uri()
            desk = chromium.load(url, 900, height)
            assert desk.console_errors == [] and desk.requests == [url], (name, desk)
            assert browser.pixel_spread(desk.png) > 10, name   # blank: ~0
            phone = chromium.load(url, 390, 800, mobile=True)
            assert phone.console_errors == [] and phone.scroll_width <= 390, (name, phone)
            size = browser.save_small_png(desk.png, tmp_path / f"{name}.png")
            assert size < 300_000, (name, size)
            if os.environ.get("COMPRESSOR_SCREENSHOTS"):
                shutil.copyfile(tmp_path / f"{name}.png",
                                os.path.join(os.environ["COMPRESSOR_SCREENSHOTS"], f"{name}.png"))


def test_device_too_small_exits_4_naming_artifact_estimate_and_budget(model, cli, tmp_path):
    ref, options = model
    device = tmp_path / "tiny.yaml"
    device.write_text(yaml.safe_dump({"name": "tiny-1mb", "memory_bytes": "1MB", "model_share": 1.0,
                                      "arch": "aarch64", "runtimes": ["onnxruntime"]}))
    recipe = tmp_path / "plain.yaml"
    recipe.write_text(yaml.safe_dump({"name": "plain", "export": ["onnx"], "steps": []}))
    out = tmp_path / "out"
    result = cli("--recipe", str(recipe), ref, *cli_args(options), "--target", str(device),
                 "--out", str(out), "--no-latency")
    assert result.returncode == 4, result.stderr
    assert "model.onnx" in result.stderr and "1,000,000" in result.stderr
    report = json.loads((out / "report.json").read_text())
    estimate = report["artifacts"][0]["est_peak_memory_bytes"]
    assert f"{estimate:,}" in result.stderr
    assert report["artifacts"][0]["fits_target"] is False and report["passed"] is False


def test_fidelity_gate_on_unlabelled_data(model, backend, tmp_path):
    """No labels at all: int8 PTQ is gated on cosine similarity to the original outputs."""
    from compressor.tasks.array.data import digits

    ref, options = model
    data = digits("NHWC" if backend == "keras" else "NCHW")
    npz = tmp_path / "unlabelled.npz"
    np.savez(npz, x_train=data.train[0], x_val=data.val[0])
    recipe = tmp_path / "int8_fidelity.yaml"
    recipe.write_text(yaml.safe_dump({"extends": "int8", "name": "int8_fidelity",
                                      "export": ["onnx"],
                                      "validate": {"metric": "fidelity", "min_fidelity": 0.99}}))
    result = compress(ref, str(recipe), str(npz), out_dir=tmp_path / "out", quiet=True,
                      latency=False, **options)
    art = result.report["artifacts"][0]
    assert result.passed, result.report["failures"]
    assert result.report["baseline"]["metric"] == "fidelity"
    assert 0.99 <= art["metric_value"] <= 1.0

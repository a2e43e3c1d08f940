"""Sweeps: one row per (recipe, artifact), failures become rows, and a re-run resumes."""
from __future__ import annotations

import pandas as pd
import pytest
import yaml

from compressor.report.html.sweep_page import render_sweep
from compressor.report.pareto import pareto_front, plot_pareto
from compressor.run.sweep import sweep
from support.html_checks import check_sweep_html


def test_pareto_front_keeps_only_undominated_points():
    frame = pd.DataFrame({"recipe": list("abcde"), "format": ["onnx"] * 5,
                          "size_bytes": [100, 50, 50, 20, 80],
                          "metric_value": [0.99, 0.97, 0.95, 0.90, 0.96]})
    assert list(pareto_front(frame, "size_bytes", "metric_value")["recipe"]) == ["d", "b", "a"]


def test_plot_pareto_draws_points_front_and_budget(tmp_path):
    frame = pd.DataFrame({"recipe": ["a", "b"], "format": ["onnx", "tflite"],
                          "size_bytes": [100, 50], "metric_value": [0.99, 0.97]})
    frame.attrs["budget_bytes"] = 75
    fig = plot_pareto(frame)
    axis = fig.axes[0]
    labels = [text.get_text() for text in axis.texts]
    assert labels == ["a (onnx)", "b (tflite)"]
    assert [line.get_label() for line in axis.lines] == ["Pareto front", "device budget"]
    fig.savefig(tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000


@pytest.mark.slow
def test_sweep_rows_errors_and_resume(tmp_path):
    from compressor.backends.examples import train_keras_digits_cnn

    model = train_keras_digits_cnn(epochs=4)
    one_shot = tmp_path / "prune_oneshot.yaml"
    one_shot.write_text(yaml.safe_dump({"name": "prune_oneshot", "export": ["onnx"],
                                        "steps": [{"pass": "prune", "sparsity": 0.3, "epochs": 0}]}))
    out = tmp_path / "sweep"
    first = sweep(model, ["fp16", "int8"], "digits", out, latency=False)
    assert list(first["recipe"]) == ["fp16", "fp16", "int8", "int8"]
    assert set(first["format"]) == {"tflite", "onnx"} and not first["cached"].any()
    reports = {name: (out / name / "report.json").stat().st_mtime_ns for name in ("fp16", "int8")}

    # "interrupted after 2 recipes": the re-run computes only the rest
    second = sweep(model, ["fp16", "int8", str(one_shot), "int8_prun30"], "digits", out,
                   latency=False)
    cached = second.groupby("recipe")["cached"].first()
    assert cached["fp16"] and cached["int8"] and not cached["prune_oneshot"]
    assert {name: (out / name / "report.json").stat().st_mtime_ns for name in reports} == reports
    assert second.loc[second.recipe == "prune_oneshot", "sparsity"].iloc[0] >= 0.28
    failed = second[second.recipe == "int8_prun30"].iloc[0]
    assert "did you mean 'int8_prune30'" in failed["error"] and not failed["passed"]
    int8 = second[second.recipe == "int8"]
    assert (int8["drop"] <= 0.01).all() and (int8["size_bytes"] < 60_000).all()
    # sweep.html (what `compress sweep` writes): every row, the front marked, report links
    (out / "sweep.html").write_text(render_sweep(second, out))
    page = check_sweep_html(out / "sweep.html", second)
    assert sorted(set(page.links)) == [f"{name}/report.html" for name in
                                       ("fp16", "int8", "prune_oneshot")]


def test_sweep_refuses_unknown_executor_and_address_without_ray(tmp_path):
    from compressor.errors import UsageError

    with pytest.raises(UsageError, match="use 'serial' or 'ray'"):
        sweep("model.keras", ["fp16"], out_dir=tmp_path, executor="dask")
    with pytest.raises(UsageError, match="address is for executor='ray'"):
        sweep("model.keras", ["fp16"], out_dir=tmp_path, address="10.0.0.1:6379")


def test_cli_sweep_rejects_unknown_executor(cli):
    result = cli("sweep", "model.keras", "--recipes", "fp16", "--executor", "dask")
    assert result.returncode == 2 and "invalid choice: 'dask'" in result.stderr
    assert "Traceback" not in result.stderr

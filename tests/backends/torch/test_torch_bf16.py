"""`precision: bf16` on the PyTorch backend's training steps: pruning and QAT fine-tune under
bfloat16 autocast (QAT's torchao observers on the bfloat16 activations) and report.json
`training` says so, with its steps, seconds and peak RSS; pruning's sparsity survives QAT."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.slow   # each test trains and exports two runs

import compressor as cz  # noqa: E402

STEPS = {
    "prune": "  - pass: prune\n    sparsity: 0.5\n    epochs: 2\n    precision: {precision}\n",
    "qat": "  - pass: quantize\n    mode: qat\n    dtype: int8\n    epochs: 1\n"
           "    precision: {precision}\n",
}


def _run(model, tmp_path, steps: str, precision: str, formats=("onnx",)):
    recipe = tmp_path / f"{precision}.yaml"
    recipe.write_text(f"name: r_{precision}\nsteps:\n" + steps.format(precision=precision)
                      + "validate:\n  max_drop: 0.03\n")
    return cz.compress(model, str(recipe), "digits", out_dir=tmp_path / precision,
                       formats=formats, latency=False, quiet=True)


@pytest.fixture(scope="module")
def digits_cnn():
    from compressor.backends import examples

    return examples.train_torch_digits_cnn(epochs=4)


def test_pruning_fine_tunes_in_bf16_and_reports_its_training(digits_cnn, tmp_path):
    import copy

    runs = {p: _run(copy.deepcopy(digits_cnn), tmp_path, STEPS["prune"], p)
            for p in ("fp32", "bf16")}
    for precision, result in runs.items():
        assert result.exit_code == 0, result.report["failures"]
        training = result.report["training"]
        assert training["precision"] == precision and training["steps"] > 0
        assert training["seconds"] > 0 and training["peak_rss_bytes"] > 0
        assert len(training["by_step"]) == 1
        assert result.report["training_peak_rss_bytes"] == training["peak_rss_bytes"]
        assert result.report["training_seconds"] == training["seconds"]
        assert training["peak_heap_increase_bytes"] > 0
    accuracy = {p: r.report["artifacts"][0]["metric_value"] for p, r in runs.items()}
    assert abs(accuracy["bf16"] - accuracy["fp32"]) <= 0.02, accuracy
    assert runs["bf16"].report["artifacts"][0]["sparsity"] >= 0.45


def test_qat_trains_in_bf16_after_a_bf16_prune_and_keeps_its_sparsity(digits_cnn, tmp_path):
    import copy

    recipe_steps = STEPS["prune"] + STEPS["qat"]
    runs = {p: _run(copy.deepcopy(digits_cnn), tmp_path, recipe_steps, p, ("onnx", "tflite"))
            for p in ("fp32", "bf16")}
    for precision, result in runs.items():
        assert result.exit_code == 0, result.report["failures"]
        training = result.report["training"]
        by_step = training["by_step"]
        assert len(by_step) == 2 and training["steps"] == sum(f["steps"] for f in by_step.values())
        assert [f["precision"] for f in by_step.values()] == [precision, precision]
    for fmt in ("onnx", "tflite"):
        rows = {p: next(a for a in r.report["artifacts"] if a["format"] == fmt)
                for p, r in runs.items()}
        assert abs(rows["bf16"]["metric_value"] - rows["fp32"]["metric_value"]) <= 0.03, rows
        assert rows["bf16"]["sparsity"] >= 0.45

"""compressor/report.py: report.md rendered from a hand-built report.json dict, and the size
and count formats it uses."""
from __future__ import annotations

import copy
from importlib import metadata

import pytest

from compressor.render.sizes import human_size
from compressor.report import package_versions, render_markdown

ARTIFACT = {
    "path": "model.tflite", "size_bytes": 12_288, "gzip_bytes": 10_240, "metric_value": 0.95,
    "drop": 0.0278, "sparsity": 0.3, "params": 12_500, "macs": 1_500_000,
    "weight_dtypes": {"int8": 0.98, "float32": 0.02}, "latency_ms_p50": 0.1234,
    "est_peak_memory_bytes": 1_048_576, "fits_target": True, "runtime": "ai-edge-litert 2.3.0",
}
REPORT = {
    "recipe": {"name": "int8_prune30", "sha256": "abcdef0123456789" * 4},
    "seed": 0,
    "target": "jetson-orin-nx-8gb",
    "budget_bytes": 8 * 1024 ** 3,
    "framework": "keras",
    "baseline": {"metric": "accuracy", "value": 0.97777, "size_bytes": 49_380, "params": 12_345,
                 "chance_level": False},
    "artifacts": [
        ARTIFACT,
        {**ARTIFACT, "path": "model.onnx", "size_bytes": 900, "drop": -0.0012, "params": None,
         "macs": None, "weight_dtypes": {"int8": 1.0}, "latency_ms_p50": None,
         "fits_target": False, "runtime": "onnxruntime 1.20.1"},
    ],
    "latency_threads": 1,
    "gate": {"max_drop": 0.01, "min_fidelity": None, "passed": False},
    "passed": False,
    "failures": ["model.tflite: accuracy drop 0.0278 > 0.01", "model.onnx does not fit"],
    "timings_s": {"prune": 12.345, "export": 3.0},
    "history": [],
    "failed_formats": [],
}


def _lines(report: dict) -> list[str]:
    return render_markdown(report).splitlines()


def _report(**changes) -> dict:
    report = copy.deepcopy(REPORT)
    report.update(changes)
    return report


def test_header_result_baseline_gate_and_seed():
    lines = _lines(REPORT)
    assert lines[0] == "# compress report: int8_prune30"
    assert lines[2:6] == [
        "- Result: **FAILED** (model.tflite: accuracy drop 0.0278 > 0.01; model.onnx does not fit)",
        "- Baseline (keras model): accuracy 0.9778, 12,345 params, 48.2 KiB fp32 weights",
        "- Gate: accuracy drop <= 0.01; target device: jetson-orin-nx-8gb (budget 8.0 GiB)",
        "- Seed 0; recipe sha256 abcdef012345",
    ]


def test_artifact_table_rows():
    lines = _lines(REPORT)
    header = lines.index("| artifact | size | gzip | accuracy | drop | sparsity | params | MACs "
                         "| weight dtypes | p50 ms | est. memory | fits |")
    assert lines[header + 2:header + 4] == [
        "| model.tflite | 12.0 KiB | 10.0 KiB | 0.9500 | +0.0278 | 30.0% | 12.50k | 1.50M "
        "| int8 98.0%, float32 2.0% | 0.123 | 1.0 MiB | yes |",
        "| model.onnx | 900 B | 10.0 KiB | 0.9500 | -0.0012 | 30.0% | - | - | int8 100.0% | - "
        "| 1.0 MiB | NO |",
    ]


def test_footer_names_the_runtimes_and_the_latency_threads():
    lines = _lines(REPORT)
    assert "Timings: prune 12.3s, export 3.0s" in lines
    assert lines[-1] == (
        "Sizes, dtypes and sparsity are read back from the artifact files; metrics and latency "
        "are measured by running them in their runtimes (ai-edge-litert 2.3.0, onnxruntime "
        "1.20.1); p50 is batch-1 latency with 1 thread(s), timed in a fresh process that loads "
        "only the runtime.")
    no_latency = _lines(_report(latency_threads=None))
    assert no_latency[-1].endswith("in their runtimes (ai-edge-litert 2.3.0, onnxruntime 1.20.1).")


def test_a_passed_run_without_target_and_a_fidelity_gate():
    # a fidelity run's baseline is the metric fidelity (1.0: the model agrees with itself)
    lines = _lines(_report(passed=True, failures=[], target=None, budget_bytes=None,
                           baseline={**REPORT["baseline"], "metric": "fidelity", "value": 1.0},
                           gate={"max_drop": 0.01, "min_fidelity": 0.999, "passed": True}))
    assert "- Result: **PASSED**" in lines
    assert "- Gate: fidelity >= 0.999; target device: none" in lines


def test_a_baseline_at_chance_level_is_flagged():
    report = _report()
    report["baseline"]["chance_level"] = True
    assert _lines(report)[3].endswith(
        "fp32 weights - **at chance level: the gate compares against a model that guesses**")


def test_quantize_mode_and_failed_formats():
    lines = _lines(_report(
        quantize={"mode": "dynamic", "reason": "the model has attention layers"},
        failed_formats=[{"format": "onnx", "error": "tf2onnx failed", "logs": "work/onnx.log"},
                        {"format": "tflite", "error": "converter crashed"}]))
    assert "int8 mode: **dynamic** (the model has attention layers)" in lines
    assert "**onnx not produced**: tf2onnx failed (logs in work/onnx.log)" in lines
    assert "**tflite not produced**: converter crashed" in lines


def test_fine_tuning_history_marks_the_kept_epoch():
    history = [
        {"step": "prune", "metric": "accuracy", "best_epoch": 2, "stopped_early": True,
         "epochs": [{"epoch": 1, "loss": 0.5, "lr": 3e-4, "val_metric": 0.9},
                    {"epoch": 2, "loss": 0.3, "lr": 1.5e-4, "val_metric": 0.96},
                    {"epoch": 3, "loss": 0.25, "lr": 0.0, "val_metric": None}]},
        {"step": "quantize", "metric": None, "best_epoch": None, "stopped_early": False,
         "epochs": [{"epoch": 1, "loss": 0.2, "lr": 3e-4, "val_metric": None}]},
    ]
    lines = _lines(_report(history=history))
    start = lines.index("## Fine-tuning")
    assert lines[start + 2:start + 9] == [
        "prune: kept epoch 2; stopped early", "",
        "| epoch | loss | lr | accuracy |", "|---:|---:|---:|---:|",
        "| 1 | 0.5000 | 3.00e-04 | 0.9000 |",
        "| 2 | 0.3000 | 1.50e-04 | **0.9600** (best) |",
        "| 3 | 0.2500 | 0.00e+00 | - |",
    ]
    assert "quantize: kept the last epoch" in lines
    assert "| epoch | loss | lr | val metric |" in lines
    assert "## Fine-tuning" not in _lines(REPORT)     # no training: no section


def test_channel_pruning_section():
    lines = _lines(_report(channel_pruning={
        "structure": "channel", "ratio": 0.3, "target_macs": None, "groups_pruned": 4,
        "model_before": {"params": 10_000, "macs": 2_000_000},
        "model_after": {"params": 5_000, "macs": 1_000_000},
        "attention_heads": [{"layer": "mha", "before": 4, "after": 3}],
        "kept_whole": [{"layers": ["conv1", "add"], "reason": "feeds a residual add"}]}))
    start = lines.index("## Channel pruning")
    assert lines[start + 2] == (
        "Removed 30% of the channels of 4 channel group(s); the model went from 10,000 to 5,000 "
        "params (0.50x) and 2,000,000 to 1,000,000 MACs (0.50x) per sample.")
    assert "- mha: 4 -> 3 heads" in lines
    assert "- conv1, add: feeds a residual add" in lines


def test_int8_fallback_section():
    lines = _lines(_report(fallback={
        "format": "tflite", "dtype": "float16", "float_layers": ["conv1"],
        "float_layer_costs": [{"layer": "conv1", "size_cost_bytes": 300}],
        "float_weight_dtypes": {"tflite": ["float16"], "onnx": []},
        "full_int8": {"metric_value": 0.9, "drop": 0.08},
        "chosen": {"metric_value": 0.97, "drop": 0.01}, "evaluations": 5,
        "ranking": [{"layer": "conv1", "sensitivity": 0.05, "size_cost_bytes": 300},
                    {"layer": "dense", "sensitivity": 0.01, "size_cost_bytes": 1200}]}))
    start = lines.index("## int8 fallback")
    assert lines[start + 2] == (
        "Full int8 (tflite): accuracy 0.9000 (drop +0.0800). Kept float (float16 asked; float "
        "weights read back: tflite: float16; onnx: none): conv1 -> accuracy 0.9700 (drop "
        "+0.0100), 5 evaluations of the val set.")
    assert lines[start + 6:start + 8] == ["| conv1 | +0.0500 | +300 B | yes | +300 B |",
                                          "| dense | +0.0100 | +1,200 B | no | - |"]


@pytest.mark.parametrize("n, text", [
    (None, "-"), (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"),
    (5 * 1024 ** 2, "5.0 MiB"), (3 * 1024 ** 3, "3.0 GiB"), (2048 * 1024 ** 3, "2048.0 GiB"),
])
def test_human_size(n, text):
    assert human_size(n) == text


def test_package_versions_name_python_and_the_installed_packages():
    versions = package_versions()
    assert versions["python"].count(".") == 2
    assert versions["numpy"] == metadata.version("numpy")

"""Every gate kind's verdict and message: the line names the artifact's number and the bound
that decided (issue 28: a min_fidelity failure used to read "fidelity drop 0.0072 > 0.01")."""
from __future__ import annotations

import pytest

from compressor.config.gate import bound_from_report, gate_bound
from compressor.config.steps import ValidateConfig
from compressor.config.gate import gate_failure, gate_passes


def _row(value: float, drop: float) -> dict:
    return {"path": "model.onnx", "metric_value": value, "drop": drop}


def test_min_fidelity_names_min_fidelity_not_the_drop():
    config = ValidateConfig(metric="fidelity", min_fidelity=0.995)
    assert not gate_passes(config, 0.9928, 0.0072)      # a drop under max_drop 0.01 still fails
    assert gate_failure(config, _row(0.9928, 0.0072)) == \
        "model.onnx fidelity 0.9928 < min_fidelity 0.995"
    assert gate_passes(config, 0.995, 0.005)            # equal passes


@pytest.mark.parametrize("config, value, drop, metric_name, line", [
    # fidelity without min_fidelity is a max_drop gate
    (ValidateConfig(metric="fidelity", max_drop=0.005), 0.9928, 0.0072, None,
     "model.onnx fidelity 0.9928 drops by 0.0072 (from 1.0000) > max_drop 0.005"),
    (ValidateConfig(max_drop=0.01), 0.9422, 0.0278, None,
     "model.onnx accuracy 0.9422 drops by 0.0278 (from 0.9700) > max_drop 0.01"),
    (ValidateConfig(metric="mse", max_drop=0.001), 0.0042, 0.0032, None,
     "model.onnx mse 0.0042 rises by 0.0032 > max_drop 0.001"),
    # a custom metric is named by its function
    (ValidateConfig(max_drop=0.02), 0.5, 0.25, "macro_f1",
     "model.onnx macro_f1 0.5000 drops by 0.2500 (from 0.7500) > max_drop 0.02"),
])
def test_max_drop_gates_name_the_number_and_max_drop(config, value, drop, metric_name, line):
    assert not gate_passes(config, value, drop)
    assert gate_passes(config, value, config.max_drop)            # equal to the bound passes
    assert gate_failure(config, _row(value, drop), metric_name) == line


@pytest.mark.parametrize("max_increase, expected", [(None, "+5.0%"), (0.10, "+10.0%")])
def test_perplexity_names_max_increase(max_increase, expected):
    config = ValidateConfig(metric="perplexity", max_increase=max_increase)
    limit = 0.05 if max_increase is None else max_increase
    assert gate_passes(config, 10.0, limit) and not gate_passes(config, 10.0, limit + 0.001)
    assert gate_failure(config, _row(55.123, 0.2)) == \
        f"model.onnx perplexity 55.123 is +20.0% vs the original's, over max_increase {expected}"


@pytest.mark.parametrize("gate, metric, text", [
    ({"max_drop": 0.01, "min_fidelity": 0.995}, "fidelity", "fidelity >= 0.995"),
    ({"max_drop": 0.01, "min_fidelity": None}, "accuracy", "accuracy drop <= 0.01"),
    # min_fidelity bounds only a fidelity metric, in report.json as in the recipe
    ({"max_drop": 0.01, "min_fidelity": 0.99}, "accuracy", "accuracy drop <= 0.01"),
    ({"max_drop": 0.001, "min_fidelity": None}, "mse", "mse rise <= 0.001"),
    ({"max_drop": 0.01, "min_fidelity": None, "max_increase": 0.1}, "perplexity",
     "perplexity increase <= +10.0%"),
])
def test_report_md_gate_line_reads_the_same_bound(gate, metric, text):
    assert bound_from_report(gate, metric).text() == text
    config = ValidateConfig(metric=metric, max_drop=gate["max_drop"],
                            min_fidelity=gate["min_fidelity"], max_increase=gate.get("max_increase"))
    assert gate_bound(config).text() == text

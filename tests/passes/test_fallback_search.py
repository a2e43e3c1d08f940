"""quantize fallback: auto — the search itself, on a fake backend whose accuracy per set of
float layers is known, so evaluation counts, rankings and the report are exact."""
from __future__ import annotations

import dataclasses

from pathlib import Path

from support import helpers
import numpy as np
import pytest

from compressor.core.context import Data, ModelState
from compressor.errors import RecipeError
from compressor.passes import fallback
from compressor.passes.fallback import Trial
from compressor.report import render_markdown
from compressor.config.steps import QuantizeConfig, ValidateConfig

LAYERS = ("conv", "hidden", "bottleneck", "logits")
BASELINE = 0.96


class FakeBackend:
    """Quantize changes nothing; export writes bytes growing with the float layers."""

    name = "fake"

    def __init__(self, layers=LAYERS):
        self.layers = layers

    def describe(self, model, example=None):
        """A conv / dense model: ptq stays static int8."""
        from compressor.backends.base import ModelInfo

        return ModelInfo(params=0, inputs=(), outputs=(), size_bytes=0)

    def quantize(self, state, config, ctx):
        return state

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
    # The fake's files are placeholders: no int8 read-back check on them.
    monkeypatch.setattr(fallback, "export_checked",
                        lambda backend, state, fmt, path, ctx: backend.export(state, fmt, path, ctx))
    x = np.zeros((4, 2), np.float32)
    return helpers.context(Data(val=(x, np.zeros(4, np.int64))), tmp_path / "work",
                           validation=ValidateConfig(max_drop=0.01), reference_outputs=x,
                           baseline_value=BASELINE, formats=("tflite",))


def _run(ctx, backend=None, **config):
    step = QuantizeConfig(mode="ptq", fallback="auto", **config)
    return helpers.apply(backend or FakeBackend(), ModelState(model="m"), step, ctx)


def _result(ctx):
    (section,) = [s for s in ctx.record.sections if s.key == "fallback"]
    return section


def test_search_ranks_layers_and_adds_them_until_the_gate_passes(fake):
    state = _run(fake, max_float_layers=3)
    result = _result(fake)
    assert [r.layer for r in result.ranking] == ["bottleneck", "hidden", "logits", "conv"]
    assert result.ranking[0].sensitivity == pytest.approx(0.10)
    # bottleneck alone leaves a 0.017 drop; with hidden, 0.002 passes the 0.01 budget.
    assert state.float_layers == ("bottleneck", "hidden")
    assert result.chosen.passed and result.chosen.drop == pytest.approx(0.002)
    assert result.evaluations == 1 + len(LAYERS) + 1      # full int8, each layer, one more step
    assert result.float_layer_costs() == [("bottleneck", 100), ("hidden", 100)]
    assert not (fake.workdir / "fallback").exists()       # candidates are cleaned up
    assert state.last(QuantizeConfig).fallback == "auto"  # the step is recorded once
    assert len(state.steps) == 1


def test_search_stops_at_max_float_layers_with_the_closest_result(fake):
    state = _run(fake, max_float_layers=1)
    assert state.float_layers == ("bottleneck",)
    assert not _result(fake).chosen.passed
    assert _result(fake).evaluations == 1 + len(LAYERS)


def test_no_search_when_full_int8_passes(fake):
    fake = dataclasses.replace(fake, baseline_value=fake_accuracy(()))   # int8 loses nothing
    state = _run(fake, backend=FakeBackend(layers=("conv",)))
    assert state.float_layers == ()
    assert _result(fake).evaluations == 1 and _result(fake).ranking == ()


def test_fallback_report_and_markdown(fake):
    _run(fake)
    report = _result(fake).report({})
    assert report["ranking"][0] == {"layer": "bottleneck", "sensitivity": 0.1,
                                    "fidelity_gain": 0.1, "size_cost_bytes": 100}
    assert report["float_layers"] == ["bottleneck", "hidden"] and report["evaluations"] == 6
    base = {"metric": "accuracy", "value": BASELINE, "params": 1, "size_bytes": 4}
    markdown = render_markdown({
        "recipe": {"name": "r", "sha256": "0" * 64}, "passed": True, "failures": [],
        "baseline": base, "framework": "fake", "gate": {"max_drop": 0.01}, "target": None,
        "seed": 0, "artifacts": [], "timings_s": {}, "fallback": report})
    assert "| bottleneck | +0.1000 | +100 B | yes | +100 B |" in markdown
    assert "| conv | +0.0000 | +100 B | no | - |" in markdown


def test_fallback_refuses_qat_and_runs_without_a_gate(fake):
    with pytest.raises(RecipeError, match="mode: ptq"):
        helpers.apply(FakeBackend(), ModelState(model="m"),
                      QuantizeConfig(mode="qat", fallback="auto"), fake)
    fake = dataclasses.replace(fake, validation=None)
    with pytest.raises(RecipeError, match="accuracy gate"):
        _run(fake)

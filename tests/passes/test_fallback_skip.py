"""quantize fallback: auto — a layer whose candidate cannot be built (the converter cannot keep
it float: BackendUnavailableError) is skipped with a note; the search goes on with the others
instead of ending the run with exit 2."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from support import helpers

from compressor.core.context import Data, ModelState
from compressor.errors import BackendUnavailableError
from compressor.passes import fallback
from compressor.passes.fallback import Trial
from compressor.config.steps import QuantizeConfig, ValidateConfig

BASELINE = 0.96


class Backend:
    """int8 loses 0.10 unless `head` is float; `stem` cannot be left float."""

    name = "fake"

    def describe(self, model, example=None):
        from compressor.backends.base import ModelInfo

        return ModelInfo(params=0, inputs=(), outputs=(), size_bytes=0)

    def quantizable_layers(self, state):
        return ["stem", "head"]

    def export(self, state, fmt, path, ctx):
        if "stem" in state.float_layers:
            raise BackendUnavailableError("the int8 tflite artifact kept 10 conv/dense op(s) "
                                          "in float")
        Path(path).write_bytes(b"x" * (1000 + 100 * len(state.float_layers)))
        return Path(path)


def test_an_unbuildable_candidate_is_skipped(monkeypatch, tmp_path):
    def evaluate(path, float_layers, ctx):
        value = BASELINE - (0.0 if "head" in float_layers else 0.10)
        drop = BASELINE - value
        return Trial(float_layers, value, drop, fidelity=1.0 - drop,
                     size_bytes=Path(path).stat().st_size, passed=drop <= 0.01)

    monkeypatch.setattr(fallback, "_evaluate", evaluate)
    monkeypatch.setattr(fallback, "export_checked",
                        lambda backend, state, fmt, path, ctx: backend.export(state, fmt, path, ctx))
    x = np.zeros((4, 2), np.float32)
    ctx = helpers.context(Data(val=(x, np.zeros(4, np.int64))), tmp_path / "work",
                          validation=ValidateConfig(max_drop=0.01), reference_outputs=x,
                          baseline_value=BASELINE, formats=("tflite",))
    step = QuantizeConfig(mode="ptq", fallback="auto")
    state = helpers.apply(Backend(), ModelState(model="m"), step, ctx)
    assert state.float_layers == ("head",)
    (found,) = [s for s in ctx.record.sections if s.key == "fallback"]
    assert [r.layer for r in found.ranking] == ["head"] and found.chosen.passed
    assert found.evaluations == 2   # full int8, then head (stem's candidate could not be built)

"""Step-order rules live in the passes, so every backend obeys the same ones; the pass (not
the backend) records each step it applied in the state."""
from __future__ import annotations

from support import helpers
import pytest

from compressor.core.context import ModelState
from compressor.errors import BackendUnavailableError, RecipeError
from compressor.schemes import Float16, Int8Qat, Scheme, apply_handler
from compressor.config.steps import PrecisionConfig, PruneConfig, QuantizeConfig


class RecordingBackend:
    """Stands in for a framework: records the calls that got past the rules (backend methods
    by name; the schemes its apply handler was asked for by scheme name)."""

    name = "recording"

    def __init__(self):
        self.calls = []

    def __getattr__(self, method):
        return lambda state, config, ctx: self.calls.append(method) or state


@apply_handler(Scheme, "recording")
def _record_scheme(backend, state, scheme, ctx):
    backend.calls.append(scheme.name)
    return state


@pytest.fixture
def backend():
    return RecordingBackend()


@pytest.fixture
def ctx(tmp_path):
    return helpers.context(workdir=tmp_path)


QUANTIZED = ModelState(model=None, steps=(QuantizeConfig(mode="ptq"),))
HALVED = ModelState(model=None, steps=(PrecisionConfig(),))


@pytest.mark.parametrize("state, config, message", [
    (QUANTIZED, PruneConfig(sparsity=0.3), "put quantize last"),
    (QUANTIZED, QuantizeConfig(mode="qat"), "put quantize last"),
    (HALVED, QuantizeConfig(mode="ptq"), "either int8 or float16"),
    (QUANTIZED, PrecisionConfig(), "either int8 or float16"),
])
def test_out_of_order_steps_are_refused_before_the_backend(backend, ctx, state, config, message):
    with pytest.raises(RecipeError, match=message):
        helpers.apply(backend, state, config, ctx)
    assert backend.calls == []


def test_bfloat16_is_refused_naming_each_format_and_why(backend, ctx):
    with pytest.raises(BackendUnavailableError, match="tflite: TFLite has no bfloat16") as info:
        helpers.apply(backend, ModelState(model=None), PrecisionConfig(dtype="bfloat16"), ctx)
    assert "onnx:" in str(info.value) and "use dtype: float16" in str(info.value)


def test_allowed_orders_reach_the_backend_and_are_recorded(backend, ctx):
    prune, qat = PruneConfig(sparsity=0.3), QuantizeConfig(mode="qat")
    state = helpers.apply(backend, ModelState(model=None), prune, ctx)
    state = helpers.apply(backend, state, qat, ctx)
    halved = helpers.apply(backend, ModelState(model=None), PrecisionConfig(), ctx)
    assert backend.calls == ["prune", "qat", "float16"]
    assert state.steps == (prune, qat) and state.last(PruneConfig) is prune
    assert isinstance(state.scheme, Int8Qat) and halved.scheme == Float16()
    assert state.last(PrecisionConfig) is None and halved.last(PrecisionConfig) == PrecisionConfig()

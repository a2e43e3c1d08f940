"""Step-order rules live in the passes, so every backend obeys the same ones."""
from __future__ import annotations

from pathlib import Path

import pytest

from compressor.context import Context, Data, ModelState
from compressor.errors import BackendUnavailableError, RecipeError
from compressor.passes.precision import PrecisionConfig
from compressor.passes.prune import PruneConfig
from compressor.passes.quantize import QuantizeConfig
from compressor.progress import Progress
from compressor.registry import get_pass


class RecordingBackend:
    """Stands in for a framework: records the calls that got past the rules."""

    name = "recording"

    def __init__(self):
        self.calls = []

    def __getattr__(self, method):
        return lambda state, config, ctx: self.calls.append(method) or state


@pytest.fixture
def ctx(tmp_path):
    return Context(data=Data(), backend=RecordingBackend(), progress=Progress(quiet=True),
                   workdir=Path(tmp_path))


QUANTIZED = ModelState(model=None, quantize=QuantizeConfig(mode="ptq"))
HALVED = ModelState(model=None, precision=PrecisionConfig())


@pytest.mark.parametrize("kind, state, config, message", [
    ("prune", QUANTIZED, PruneConfig(sparsity=0.3), "put quantize last"),
    ("quantize", QUANTIZED, QuantizeConfig(mode="qat"), "put quantize last"),
    ("quantize", HALVED, QuantizeConfig(mode="ptq"), "either int8 or float16"),
    ("precision", QUANTIZED, PrecisionConfig(), "either int8 or float16"),
])
def test_out_of_order_steps_are_refused_before_the_backend(ctx, kind, state, config, message):
    with pytest.raises(RecipeError, match=message):
        get_pass(kind)(state, config, ctx)
    assert ctx.backend.calls == []


def test_bfloat16_is_refused_naming_each_format_and_why(ctx):
    with pytest.raises(BackendUnavailableError, match="tflite: TFLite has no bfloat16") as info:
        get_pass("precision")(ModelState(model=None), PrecisionConfig(dtype="bfloat16"), ctx)
    assert "onnx:" in str(info.value) and "use dtype: float16" in str(info.value)


def test_allowed_orders_reach_the_backend(ctx):
    state = get_pass("prune")(ModelState(model=None), PruneConfig(sparsity=0.3), ctx)
    get_pass("quantize")(state, QuantizeConfig(mode="qat"), ctx)
    get_pass("precision")(ModelState(model=None), PrecisionConfig(), ctx)
    assert ctx.backend.calls == ["prune", "quantize_qat", "to_precision"]

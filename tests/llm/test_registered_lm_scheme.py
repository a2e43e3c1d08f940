"""A language-model scheme added from outside the package, by registration alone: int4 whose
integers are rounded down (floor) onto the symmetric grid instead of to the nearest step.

It subclasses the built-in int4 scheme, so it inherits its recipe keys (group_size, ...), the
storage it declares (which the planner counts) and the ONNX / TFLite export handlers; its own
apply handler makes the integers. Nothing in compressor/ names it: `compress --recipe FILE`
writes its folder, the file holds its integers, and `compress plan` counts it."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest
import yaml

from compressor.schemes import Int4WeightOnly, apply_handler, register_scheme
from compressor.schemes.base import unregister_scheme

pytestmark = pytest.mark.slow

CONTEXT = 256
PARAM, NODE = "model.layers.1.self_attn.o_proj.weight", "/model/layers.1/attn/o_proj/MatMulNBits"


@dataclass(frozen=True)
class FloorInt4(Int4WeightOnly):
    """int4 weight-only, each weight rounded toward -inf on its group's symmetric grid."""

    name: ClassVar[str] = "weight_only_floor"


def floor_codes(weight, group: int):
    """(codes uint8 [N, K] in 0..15 with zero point 8, scales float32 [N, K / group])."""
    import torch

    n, k = weight.shape
    groups = weight.detach().to(torch.float32).reshape(n, k // group, group)
    scales = (groups.abs().amax(-1) / 7).clamp(min=1e-8)
    codes = torch.clamp(torch.floor(groups / scales[..., None]), -8, 7) + 8
    return codes.reshape(n, k).to(torch.uint8), scales


@apply_handler(FloorInt4, "llm")
def _floor(backend, state, scheme, ctx):
    import torch

    from compressor.backends.llm.handlers import weight_only_plan
    from compressor.backends.llm.model import QuantizedLinear
    from compressor.backends.llm.quantize import quantized_weight_names

    plan = weight_only_plan(scheme, state.model)          # the storage the scheme declares
    assert (plan.bits, plan.symmetric) == (4, True)
    params = dict(state.model.model.named_parameters(remove_duplicate=False))
    quantized = {}
    for name in quantized_weight_names(state.model.model):
        codes, scales = floor_codes(params[name], plan.group_size)
        zeros = torch.full(scales.shape, 8, dtype=torch.uint8)
        quantized[name] = QuantizedLinear(codes, scales, zeros, 4, plan.group_size)
    return state.replace(model=state.model.with_quantized(quantized))


@pytest.fixture(scope="module", autouse=True)
def floor_scheme():
    """Registered for this module's test only: other tests read the registered schemes."""
    register_scheme(FloorInt4)
    yield FloorInt4
    unregister_scheme(FloorInt4)


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    path = tmp_path_factory.mktemp("floor") / "floor.yaml"
    path.write_text(yaml.safe_dump({
        "name": "floor", "export": ["onnx"], "validate": {"metric": "perplexity",
                                                          "max_increase": 1.0},
        # int8_budget 1.0: its handler makes every matrix int4 (the inherited key declares
        # the int8 share the planner counts)
        "steps": [{"pass": "quantize", "mode": "weight_only_floor", "dtype": "int4",
                   "group_size": 32, "int8_budget": 1.0}]}))
    return path


def test_a_registered_lm_scheme_runs_end_to_end_and_is_planned(recipe, random_lm_dir, tmp_path,
                                                                 monkeypatch):
    pytest.importorskip("onnxruntime_genai")
    import onnx
    from onnx import numpy_helper

    from compressor.backends.llm.load import load_lm
    from compressor.cli import main
    from compressor.plan import plan

    folder = random_lm_dir("llama")
    out = tmp_path / "out"
    monkeypatch.setenv("COMPRESSOR_CLI", "")   # main() sets it; restored after the test
    assert main(["--recipe", str(recipe), str(folder), "--format", "onnx", "--out", str(out),
                 "--context", str(CONTEXT), "--no-latency", "--quiet"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["quantize"]["mode"] == "weight_only_floor"
    (row,) = report["artifacts"]
    assert row["scheme"] == "int4 weight_only_floor" and row["weight_bits"] == 4

    # the file holds the floor levels (round to nearest gives about half of them)
    weight = dict(load_lm(folder).model.named_parameters())[PARAM]
    expected, scales = floor_codes(weight, 32)
    model = onnx.load(str(out / "model-onnx" / "model.onnx"))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    node = next(n for n in model.graph.node if n.name == NODE)
    n, k = expected.shape
    packed = inits[node.input[1]].reshape(n, -1)
    stored = np.stack([packed & 0xF, packed >> 4], -1).reshape(n, -1)[:, :k]
    assert (stored == expected.numpy()).all()
    nearest = np.clip(np.round(weight.detach().numpy().reshape(n, -1, 32)
                               / scales.numpy()[..., None]), -8, 7).reshape(n, k) + 8
    assert 0.3 < np.mean(nearest != stored) < 0.7

    # and the planner counts it from the storage it inherits: the folder's bytes
    (planned,) = plan(str(folder), target="jetson-orin-nx-8gb", context=CONTEXT,
                      recipes=[str(recipe)])["plans"]
    written = sum(f.stat().st_size for f in (out / "model-onnx").iterdir()
                  if f.name.startswith("model.onnx"))
    assert planned["recipe"] == "floor"
    assert planned["weights_bytes"] == pytest.approx(written, rel=0.02)

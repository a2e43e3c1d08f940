"""A quantization scheme added from outside the package, by registration alone: a toy int8
weight-only scheme that rounds weights down (floor) onto the per-channel int8 grid instead of
to the nearest step. It subclasses the built-in weight-only scheme, so the built-in export
handlers write its files; its own apply handler snaps the Keras kernels first. Nothing in
compressor/ names it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest
import yaml
from support import keras_models as km
from support.keras_models import onnx_kernel_weights

import compressor as cz
from compressor.tasks.array.data import load_data
from compressor.schemes import Int8WeightOnly, apply_handler, register_scheme

LEVELS = 127


@register_scheme
@dataclass(frozen=True)
class FloorWeightOnly(Int8WeightOnly):
    """int8 weight-only, rounded toward -inf: a different rounding on the same grid."""

    name: ClassVar[str] = "weight_only_floor"


def channel_scales(kernel: np.ndarray) -> np.ndarray:
    """Symmetric per-output-channel scales (Keras kernels keep output channels last)."""
    return np.abs(kernel.astype(np.float64)).reshape(-1, kernel.shape[-1]).max(axis=0) / LEVELS


def floor_levels(kernel: np.ndarray) -> np.ndarray:
    # rounded to 1e-6 first, so a channel's peak (exactly +-127 levels) is not floored to 126
    return np.floor(np.round(kernel.astype(np.float64) / channel_scales(kernel), 6))


@apply_handler(FloorWeightOnly, "keras")
def _snap_down(backend, state, scheme, ctx):
    model = backend.clone(state.model)
    for layer in model.layers:
        weights = layer.get_weights()
        if weights and weights[0].ndim >= 2:   # kernels; biases stay float
            kernel = weights[0]
            weights[0] = (floor_levels(kernel) * channel_scales(kernel)).astype(kernel.dtype)
            layer.set_weights(weights)
    return state.replace(model=model)


@pytest.fixture(scope="module")
def trained():
    data = load_data("digits", "NHWC", "keras")
    return km.train(km.digits_cnn(), data, epochs=3), data


@pytest.mark.slow
def test_a_registered_scheme_runs_end_to_end_in_both_formats(trained, tmp_path):
    model, data = trained
    recipe = tmp_path / "floor.yaml"
    recipe.write_text(yaml.safe_dump({
        "name": "floor", "steps": [{"pass": "quantize", "mode": "weight_only_floor"}],
        "export": ["tflite", "onnx"], "validate": {"metric": "accuracy", "max_drop": 0.03}}))
    result = cz.compress(model, recipe=str(recipe), data=data, out_dir=tmp_path / "out")
    report = result.report
    assert result.exit_code == 0, report["failures"]
    assert report["quantize"]["mode"] == "weight_only_floor"
    assert [row["format"] for row in report["artifacts"]] == ["tflite", "onnx"]
    for row in report["artifacts"]:
        assert row["scheme"] == "int8 weight_only_floor"
        assert row["weight_share_at_bits"] >= 0.9 and row["drop"] <= 0.03, row
        assert "weight-only" in row["made_by"] or "weight_only" in row["made_by"], row

    # The file holds the floor levels: the first kernel's int8 values are floor(w / s) (in
    # ONNX's own layout: compared as sorted values), which round-to-nearest gives for only
    # about half of them.
    kernel = model.layers[0].get_weights()[0]
    levels = np.sort(floor_levels(kernel).reshape(-1))
    stored = [w for w in onnx_kernel_weights(result.artifacts["onnx"]) if w.size == kernel.size]
    assert stored and stored[0].dtype == np.int8
    assert np.array_equal(np.sort(stored[0].reshape(-1)), levels)
    nearest = np.round(kernel.astype(np.float64) / channel_scales(kernel))
    assert 0.3 < np.mean(nearest != floor_levels(kernel)) < 0.7


def test_an_unregistered_mode_is_a_recipe_error_naming_the_registered_ones(tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(yaml.safe_dump({"name": "bad", "steps": [
        {"pass": "quantize", "mode": "weight_only_flor"}]}))
    with pytest.raises(cz.RecipeError, match="steps.0: unknown quantize mode 'weight_only_flor'"
                                             ".*did you mean 'weight_only_floor'"):
        cz.load_recipe(str(recipe))

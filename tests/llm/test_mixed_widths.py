"""An int4 recipe's mixed bit widths and per-model candidates (backends/llm/mixed.py,
candidates.py): which matrices int8 is bought for within the byte budget, the int8 grid both
runtimes store exactly, and the candidates scored against the float model."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from compressor.backends.llm import mixed
from compressor.backends.llm.grid import int8_blocks, int8_rows, output_error, rtn


def _unit(name: str, error: float, extra: int) -> mixed.Unit:
    return mixed.Unit(name, (f"{name}.weight",), error, extra)


def test_each_order_buys_int8_while_the_bytes_fit():
    units = [_unit("a", 0.5, 100), _unit("b", 0.4, 10), _unit("c", 0.1, 10)]

    def names(order, tables=frozenset()):
        return [u.name for u in mixed.chosen(units, 105, order, tables)]

    assert names("error") == ["a"]                      # b would take it to 110
    assert names("error_per_byte") == ["b", "c"]        # a would take it to 120
    assert names("table_first", frozenset({"c.weight"})) == ["c", "b"]
    assert mixed.chosen(units, 5, "error") == []


def test_int8_rows_is_symmetric_per_row_and_within_half_a_step():
    torch.manual_seed(0)
    weight = torch.randn(24, 256) * torch.linspace(0.1, 3.0, 24)[:, None]
    q = int8_rows(weight, 128)
    assert q.bits == 8 and q.group_size == 128 and (q.zeros == 128).all()
    assert (q.scales[:, 0:1] == q.scales).all()         # one scale per row, repeated per block
    step = weight.abs().amax(dim=1, keepdim=True) / 127
    assert torch.allclose(q.scales[:, :1], step, rtol=2 ** -11)   # float16-exact (GGUF's Q8_0)
    assert (q.scales == q.scales.half().float()).all()
    assert ((q.dequantize() - weight).abs() <= q.scales[:, :1] / 2 + 1e-6).all()
    # at 8 bits the output error is ~256x smaller than int4's
    int4 = rtn(weight, 4, 32, symmetric=True)
    assert output_error(weight, q, None) < output_error(weight, int4, None) / 100
    # a scale per 32 inputs (llama.cpp's Q8_0): closer still, each block's own half step
    blocks = int8_blocks(weight, 32)
    assert blocks.group_size == 32 and (blocks.zeros == 128).all()
    assert ((blocks.dequantize() - weight).abs()
            <= blocks.scales.repeat_interleave(32, dim=1) / 2 + 1e-6).all()
    assert output_error(weight, blocks, None) < output_error(weight, q, None)


def test_units_keep_qkv_and_gate_up_together_and_price_int8(random_lm_dir):
    from compressor.backends.llm.load import load_lm
    from compressor.backends.llm.quantize import WeightOnlyPlan, quantize_candidates

    loaded = load_lm(random_lm_dir("llama"))
    made = quantize_candidates(loaded, WeightOnlyPlan(4, 32, "rtn", True), None, ("rtn",),
                               measure=True)["rtn"]
    units = {u.name: u for u in mixed.units(made.weights, made.errors)}
    assert {"model.layers.0.self_attn.qkv", "model.layers.0.mlp.gate_up",
            "model.layers.0.self_attn.o_proj", "model.layers.0.mlp.down_proj"} <= set(units)
    qkv = units["model.layers.0.self_attn.qkv"]
    assert len(qkv.params) == 3 and qkv.error == pytest.approx(
        sum(made.errors[p] for p in qkv.params))
    down = made.weights["model.layers.0.mlp.down_proj.weight"]
    n, k = down.shape
    # int4 groups of 32: K/2 + 4 K/32 bytes a row; int8 (block 128 or the widest dividing K)
    assert mixed.onnx_bytes(down) == n * (k // 2 + 4 * (k // 32))
    assert units["model.layers.0.mlp.down_proj"].extra_bytes == mixed.int8_bytes(n, k) - \
        mixed.onnx_bytes(down)


@pytest.mark.slow
def test_candidates_are_scored_against_the_float_model(trained_lm_dir, lm_tokenizer):
    """auto on the trained tiny Llama: GPTQ and round to nearest, each with the int8 mixes
    that fit 1.15x; the winner is the lowest KL on held-out windows, and re-measuring it
    gives that score."""
    from compressor.backends.llm.candidates import choose_weights, kl_from_float
    from compressor.backends.llm.handlers import weight_only_plan
    from compressor.backends.llm.load import load_lm
    from compressor.schemes import Int4WeightOnly
    from compressor.tasks.lm.text_data import TextData

    loaded = load_lm(trained_lm_dir)
    calibration, _ = TextData(calibration_windows=16).windows(lm_tokenizer)
    plan = weight_only_plan(Int4WeightOnly(), loaded)
    assert (plan.algorithm, plan.int8_budget) == ("auto", 1.15)
    weights, record = choose_weights(loaded, plan, calibration)
    tried = {t["name"]: t["settings"] | {"kl": t["score"]} for t in record["tried"]}
    assert {"gptq", "rtn"} <= set(tried) and any("+int8_by_" in name for name in tried)
    assert record["scored_on"].startswith("4 held-out calibration windows of 256 tokens")
    assert record["step"] == "quantize" and record["artifact"] == "all"
    assert record["winner"] == min(tried, key=lambda name: tried[name]["kl"])
    assert all(1.0 <= t["bytes_ratio"] <= 1.15 for t in tried.values())
    assert all(t["bytes_ratio"] == 1.0 for t in tried.values() if not t["int8"])
    # the mixes measure closer than all-int4 of the same algorithm on this model
    for algorithm in ("gptq", "rtn"):
        mixes = [t["kl"] for name, t in tried.items() if name.startswith(f"{algorithm}+")]
        assert mixes and min(mixes) < tried[algorithm]["kl"]
    (again,) = kl_from_float(loaded.model, [weights], calibration[-4:])
    assert again == pytest.approx(tried[record["winner"]]["kl"], rel=1e-4)
    winner = tried[record["winner"]]
    at_8 = {name for name, w in weights.items() if w.bits == 8}
    assert len(at_8) >= len(winner["int8"]) > 0
    # explicit algorithm, no budget: one candidate, nothing to record
    fixed = dataclasses.replace(plan, algorithm="rtn", int8_budget=1.0)
    only, none = choose_weights(loaded, fixed, calibration)
    assert none is None and {w.bits for w in only.values()} == {4}
    assert np.isfinite(again)


@pytest.mark.slow
def test_int8_is_scored_as_each_file_computes_it(trained_lm_dir, lm_tokenizer):
    """int8: per group with zero points (exact in ONNX, rounded again per row in a .tflite)
    against symmetric per row (exact in both); with a .tflite asked for, each is judged on
    its worse file."""
    from compressor.backends.llm.candidates import choose_weights
    from compressor.backends.llm.handlers import weight_only_plan
    from compressor.backends.llm.litert_grid import as_computed
    from compressor.backends.llm.load import load_lm
    from compressor.schemes import Int8WeightOnly
    from compressor.tasks.lm.text_data import TextData

    loaded = load_lm(trained_lm_dir)
    calibration, _ = TextData(calibration_windows=8).windows(lm_tokenizer)
    plan = weight_only_plan(Int8WeightOnly(), loaded)
    weights, record = choose_weights(loaded, plan, calibration, formats=("onnx", "tflite"))
    tried = {t["name"]: t for t in record["tried"]}
    groups, rows = tried["rtn"], tried["rtn_rows"]
    # the .tflite rounds the zero-point grid again: further from float than the ONNX file
    assert groups["by_format"]["tflite"] > groups["by_format"]["onnx"]
    # the same integers in both files; the .tflite also rounds their inputs to int8 per token
    assert rows["by_format"]["tflite"] > rows["by_format"]["onnx"]
    assert groups["score"] == groups["by_format"]["tflite"]             # the worse file
    assert record["winner"] == min(tried, key=lambda name: tried[name]["score"])
    if record["winner"] == "rtn_rows":
        assert all(as_computed(w) is w for w in weights.values())
    # ONNX alone: the zero-point grid is scored as ONNX computes it, exactly
    _, alone = choose_weights(loaded, plan, calibration, formats=("onnx",))
    assert {t["name"]: set(t["by_format"]) for t in alone["tried"]} == \
        {"rtn": {"onnx"}, "rtn_rows": {"onnx"}}


def test_act_order_gptq_keeps_static_contiguous_groups_and_beats_rounding():
    """Columns rounded in order of input energy, on grids set from the original weights: the
    stored groups are the input-order ones, and the outputs move less than round to nearest
    on the same grids."""
    from compressor.backends.llm.grid import gptq, grid_params

    torch.manual_seed(0)
    # correlated inputs of uneven energy: what GPTQ's updates can absorb errors into
    x = (torch.randn(512, 16) @ torch.randn(16, 64)) * torch.linspace(0.2, 4.0, 64)
    weight = torch.randn(16, 64)
    hessian = x.T @ x
    ordered = gptq(weight, hessian, 4, 32, symmetric=True, act_order=True)
    for g in range(2):
        cols = slice(32 * g, 32 * (g + 1))
        scale, _ = grid_params(weight[:, cols], 4, True, torch.diag(hessian)[cols])
        assert torch.equal(ordered.scales[:, g], scale)
    rounded = rtn(weight, 4, 32, symmetric=True, importance=torch.diag(hessian))
    assert torch.equal(rounded.scales, ordered.scales)

    def moved(q):
        return float(((x @ (q.dequantize() - weight).T) ** 2).sum())

    assert moved(ordered) < 0.8 * moved(rounded)

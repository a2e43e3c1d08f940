"""Mixtures of experts (transformers 5's experts modules: 3-D gate_up_proj [E, 2I, H] and
down_proj [E, H, I], a router `mlp.gate` [E, H]): every expert's matrices quantized on the
recipe's grid (GPTQ per expert from the tokens routed to it), the router left float, torch
computing with the integers close to the float model; and the TFLite route end to end on a
tiny Qwen3-MoE (4 experts, 2 per token): each expert's int4 integers in the file as they were
made, the router float32, LiteRT's logits and greedy generation against torch computing with
the same integers (one conversion, ~20-30 s)."""
from __future__ import annotations

import numpy as np
import pytest

from llm.test_litert_route import CONTEXT, _agrees_with_torch, _export, _loaded

EXPERTS = 4


def _calibration(folder, windows=4, window=64):
    from transformers import AutoTokenizer

    from compressor.tasks.lm.text_data import TextData

    data = TextData(calibration_windows=windows, eval_windows=2, window=window)
    return data.windows(AutoTokenizer.from_pretrained(folder))


def _quantized(folder, algorithm="gptq"):
    """(LoadedLm with its integers, (calibration, evaluation) windows): int4, symmetric groups
    of 32, as the int4 recipe makes them for a TFLite file."""
    from compressor.backends.llm.quantize import WeightOnlyPlan, quantize_lm

    windows = _calibration(folder)
    loaded = _loaded(folder)
    plan = WeightOnlyPlan(4, 32, algorithm, symmetric=True)
    return loaded.with_quantized(quantize_lm(loaded, plan, windows[0])), windows


@pytest.fixture(scope="module")
def qwen3_moe_int4(bf16_lm_dir):
    return _quantized(bf16_lm_dir("qwen3_moe"))


@pytest.fixture(scope="module", params=["qwen3_moe", "mixtral"])
def moe(request, bf16_lm_dir, qwen3_moe_int4):
    if request.param == "qwen3_moe":
        return request.param, qwen3_moe_int4
    return request.param, _quantized(bf16_lm_dir(request.param))


def test_every_expert_is_stored_in_integers_and_the_router_stays_float(moe):
    import torch

    from compressor.backends.llm.quantize import quantized_weight_names, quantized_weights

    family, (loaded, (_, evaluation)) = moe
    model = loaded.model
    params = dict(model.named_parameters())
    experts = [n for n in loaded.quantized if ".experts." in n]
    assert sorted(experts) == sorted(f"model.layers.{i}.mlp.experts.{p}" for i in range(2)
                                     for p in ("gate_up_proj", "down_proj"))
    for name in experts:
        weight = loaded.quantized[name]
        assert weight.shape == tuple(params[name].shape) and weight.experts == EXPERTS
        assert weight.scales.shape == (*params[name].shape[:2], params[name].shape[2] // 32)
        # each expert its own integers (not one grid shared, not left at zero), near its floats
        for e, matrix in enumerate(weight.matrices()):
            float_ = params[name][e].detach().float()
            error = (matrix.dequantize() - float_).abs().max()
            assert 0 < error <= matrix.scales.max() * 3    # at most 1.4 steps measured
            assert len(torch.unique(matrix.q)) > 4
    routers = [n for n in params if n.endswith("mlp.gate.weight")]
    assert len(routers) == 2 and not set(routers) & set(quantized_weight_names(model))
    assert all(params[n].dtype == torch.float32 for n in routers)
    ids = torch.as_tensor(evaluation)
    with torch.no_grad():
        reference = model(input_ids=ids).logits
        with quantized_weights(loaded):
            swapped = model(input_ids=ids).logits
            router = params[routers[0]].detach().clone()
        after = model(input_ids=ids).logits
    assert torch.equal(reference, after)                     # the model's own weights restored
    assert torch.equal(router, params[routers[0]].detach())   # the router was never swapped
    relative = ((swapped - reference).pow(2).mean() / reference.var()).sqrt()
    print(f"\n{family}: int4 logits vs float, relative RMS {relative:.3f}")
    assert 0 < relative < 0.3     # 0.16 measured (random init: flat logits)


def test_gptq_per_expert_beats_round_to_nearest_on_the_tokens_routed_to_it(qwen3_moe_int4,
                                                                          bf16_lm_dir):
    """The Hessian each expert is calibrated with is built from the tokens the router sent
    it: on those tokens, GPTQ's outputs are closer to the float expert's than RTN's."""
    import torch

    from compressor.backends.llm.experts import ExpertInputs, matrix

    gptq, (calibration, _) = qwen3_moe_int4
    rtn, _ = _quantized(bf16_lm_dir("qwen3_moe"), "rtn")
    experts = gptq.model.model.layers[0].mlp.experts
    inputs = ExpertInputs(experts)     # layer 0's routed inputs: no quantized layer before it
    try:
        with torch.no_grad():
            gptq.model(input_ids=torch.as_tensor(calibration))
    finally:
        inputs.remove()
    assert sum(inputs.tokens) == calibration.size * 2          # 2 experts per token
    name = "model.layers.0.mlp.experts.gate_up_proj"
    for e in range(EXPERTS):
        w = matrix(experts.gate_up_proj.detach(), e, False).float()
        errors = [torch.trace((q.expert(e).dequantize() - w) @ inputs.first[e]
                              @ (q.expert(e).dequantize() - w).T)
                  for q in (gptq.quantized[name], rtn.quantized[name])]
        assert errors[0] < errors[1], (e, errors)


def test_an_expert_the_calibration_text_barely_reached_is_rounded_to_nearest():
    import torch

    from compressor.backends.llm.experts import MIN_EXPERT_TOKENS, quantize_experts
    from compressor.backends.llm.grid import gptq, rtn

    torch.manual_seed(0)
    weights, x = torch.randn(3, 16, 64), torch.randn(200, 64)
    hessians = torch.stack([x.T @ x] * 3)

    def one(w, h):
        return rtn(w, 4, 32, True) if h is None else gptq(w, h, 4, 32, True)

    stacked = quantize_experts(weights, False, one, hessians, [200, MIN_EXPERT_TOKENS - 1, 0])
    assert torch.equal(stacked.expert(0).q, gptq(weights[0], hessians[0], 4, 32, True).q)
    for e in (1, 2):
        assert torch.equal(stacked.expert(e).q, rtn(weights[e], 4, 32, True).q)
    # [E, in, out] experts (is_transposed) are quantized as their [out, in] matrices
    flipped = quantize_experts(weights.transpose(1, 2), True, one)
    assert flipped.transposed and flipped.shape == (3, 16, 64)
    rounded = torch.stack([rtn(w, 4, 32, True).dequantize() for w in weights])
    assert torch.equal(flipped.parameter(), rounded.transpose(1, 2))


def test_group_sizes_that_do_not_divide_the_experts_width_are_refused(bf16_lm_dir):
    from compressor.backends.llm.quantize import WeightOnlyPlan, check_grid_fits
    from compressor.errors import RecipeError

    loaded = _loaded(bf16_lm_dir("qwen3_moe"))
    check_grid_fits(loaded, WeightOnlyPlan(4, 32))
    with pytest.raises(RecipeError, match="width 32 of this model's linears; use group_size: 32"):
        check_grid_fits(loaded, WeightOnlyPlan(4, 64))   # down_proj's input: moe_intermediate 32


@pytest.fixture(scope="module")
def moe_int4(qwen3_moe_int4, tmp_path_factory):
    from compressor.schemes import Int4WeightOnly

    loaded, _ = qwen3_moe_int4
    path, ctx = _export(loaded, Int4WeightOnly(), tmp_path_factory.mktemp("litert-moe"))
    return loaded, path, ctx


@pytest.mark.slow
def test_int4_mixture_of_experts_in_litert_computes_its_integers(moe_int4):
    from compressor.backends.llm.litert_weights import read
    from ai_edge_litert import schema_py_generated as schema

    loaded, path, ctx = moe_int4
    runtime = _agrees_with_torch(moe_int4, 0.02)     # 3.1e-3 measured
    assert runtime.kv_cache_bytes == 2 * 2 * 2 * 16 * CONTEXT * 4
    # 2 layers x (4 attention + 2 x 4 expert matrices) + lm_head + untied embedding
    notes = ctx.record.notes["tflite_weights"]
    assert notes == {"as_quantized": 26, "scales_rounded_to_bf16": [], "rounded_again": [],
                     "left_float": [], "stored_twice": []}
    model = read(path)
    int4 = {bytes(model.buffers[t.buffer].data) for g in model.subgraphs for t in g.tensors
            if t.type == schema.TensorType.INT4}
    for name, weight in loaded.quantized.items():
        for matrix in weight.matrices():
            codes = (matrix.q.numpy().astype(np.int16) - 8).astype(np.uint8).reshape(-1) & 0xF
            assert bytes(codes[0::2] | (codes[1::2] << 4)) in int4, name
    # the routers: float32 [E, H], their values as in the model
    routers = {bytes(p.detach().float().numpy().tobytes())
               for n, p in loaded.model.named_parameters() if n.endswith("mlp.gate.weight")}
    floats = {bytes(model.buffers[t.buffer].data) for g in model.subgraphs for t in g.tensors
              if t.type == schema.TensorType.FLOAT32 and list(t.shape) == [EXPERTS, 64]}
    assert routers <= floats

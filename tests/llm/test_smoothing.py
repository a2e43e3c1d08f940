"""Smoothing for a .tflite's run-time int8 inputs (backends/llm/smoothing.py, dynamic_int8.py):
the inputs are rounded as XNNPACK rounds them, the folds are found without naming a family and
never change the float model's function, and the candidate is kept only where it scores closer."""
from __future__ import annotations

import numpy as np
import pytest
import torch


def test_rows_are_rounded_on_their_own_asymmetric_int8_grid():
    from compressor.backends.llm.dynamic_int8 import rounded_rows

    torch.manual_seed(0)
    x = torch.randn(6, 64) * torch.tensor([1.0, 10.0, 0.1, 3.0, 1.0, 1.0])[:, None]
    x[4] = x[4].abs()          # a row of one sign: 0 still on the grid
    x[5] = 0.0
    y = rounded_rows(x)
    step = (x.amax(1).clamp(min=0) - x.amin(1).clamp(max=0)) / 255
    assert torch.all((y - x).abs() <= step[:, None] / 2 + 1e-6)
    assert torch.equal(y[5], x[5])                          # all zeros stay exact
    assert len(torch.unique(y[0])) <= 256 and len(torch.unique(y[0])) > 40
    # each row has its own step: the large row does not coarsen the small one
    assert float((y[2] - x[2]).abs().max()) < 0.1 * float((y[1] - x[1]).abs().max())


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


@pytest.mark.parametrize("family", ["llama", "gemma", "olmo2", "phi3", "gpt2"])
def test_folds_never_change_the_float_model(random_lm_dir, lm_tokenizer, family):
    """Every family: the sites found are folded at uneven scales and the logits stay put;
    Gemma's 1 + w norm cannot take a fold (refused by the check), GPT-2's Conv1D matrices
    are not sites, a gated MLP's down projection is smoothed through its up projection."""
    from compressor.backends.llm.load import load_lm
    from compressor.backends.llm.quantize import quantized_weight_names
    from compressor.backends.llm.smoothing import find_sites, fold, scales
    from compressor.tasks.lm.text_data import TextData

    loaded = load_lm(random_lm_dir(family))
    model = loaded.model
    calibration, _ = TextData(calibration_windows=8).windows(lm_tokenizer)
    ids = torch.as_tensor(calibration[:2, :48])
    before = _logits(model, ids)
    sites = find_sites(model, quantized_weight_names(model), calibration)
    names = {module: name for name, module in model.named_modules()}
    for site in sites:
        site.absmax = torch.rand(site.consumers[0].weight.shape[1]) * 20 + 0.1
        assert fold(site, scales(site, 0.5))
    after = _logits(model, ids)
    assert float((after - before).abs().max()) <= 1e-3 * float(before.abs().max())
    kinds = {(site.kind, names[site.producer].rpartition(".")[2]) for site in sites}
    if family == "gpt2":
        assert sites == []
    elif family == "gemma":     # no norm fold; the MLP's up projection still takes one
        assert kinds == {("rows", "up_proj")}
    elif family == "llama":
        assert kinds == {("norm", "input_layernorm"), ("norm", "post_attention_layernorm"),
                         ("rows", "up_proj")}
        assert len(sites) == 3 * model.config.num_hidden_layers
        # the tied head (the embedding's table too) is never a consumer
        assert all(site.consumers[0] is not model.lm_head for site in sites)


@pytest.mark.slow
def test_smoothing_is_a_candidate_for_formats_that_round_their_inputs(trained_lm_dir,
                                                                       lm_tokenizer):
    """ONNX alone (float inputs): not tried, the model untouched. With a .tflite: the model as
    it is and the smoothed one are scored as each file computes them (the .tflite with its
    inputs rounded: further from float than ONNX), the closer is kept, and the float model's
    function is the same either way."""
    from compressor.backends.llm.handlers import weight_only_plan
    from compressor.backends.llm.load import load_lm
    from compressor.backends.llm.smoothing import KEEP_BELOW, choose_smoothing
    from compressor.schemes import Int8WeightOnly
    from compressor.tasks.lm.text_data import TextData

    loaded = load_lm(trained_lm_dir)
    calibration, held_out = TextData(calibration_windows=16).windows(lm_tokenizer)
    ids = torch.as_tensor(held_out[:2])
    before = _logits(loaded.model, ids)
    state = {k: v.clone() for k, v in loaded.model.state_dict().items()}
    plan = weight_only_plan(Int8WeightOnly(), loaded)
    assert choose_smoothing(loaded, plan, calibration, ("onnx",)) is None
    assert all(torch.equal(v, state[k]) for k, v in loaded.model.state_dict().items())

    record = choose_smoothing(loaded, plan, calibration, ("onnx", "tflite"))
    tried = {t["name"]: t for t in record["tried"]}
    assert set(tried) == {"none", "smooth_0.5"}
    for entry in tried.values():
        assert entry["by_format"]["tflite"] > entry["by_format"]["onnx"] > 0
        assert entry["score"] == entry["by_format"]["tflite"]
    smoothed_closer = tried["smooth_0.5"]["score"] < KEEP_BELOW * tried["none"]["score"]
    assert record["winner"] == ("smooth_0.5" if smoothed_closer else "none")
    assert tried["smooth_0.5"]["settings"]["sites"] == 3 * loaded.model.config.num_hidden_layers
    changed = [k for k, v in loaded.model.state_dict().items() if not torch.equal(v, state[k])]
    assert bool(changed) == (record["winner"] != "none")
    after = _logits(loaded.model, ids)
    assert np.allclose(after.numpy(), before.numpy(), atol=1e-3 * float(before.abs().max()))


@pytest.mark.slow
def test_int4_qat_trains_through_the_tflite_input_rounding(random_lm_dir):
    """The forward rounds each quantized matrix's input as the .tflite will, the gradient
    passes it unchanged; QAT trains so when a .tflite is exported, never for ONNX alone, and
    leaves no hook behind on the caller's model."""
    from compressor.backends.llm.dynamic_int8 import int8_inputs, rounded_rows
    from compressor.backends.llm.load import load_lm
    from compressor.backends.llm.qat import train
    from compressor.backends.llm.quantize import WeightOnlyPlan, quantize_lm
    from compressor.config.steps import QuantizeConfig
    from compressor.core.progress import Progress
    from compressor.tasks.lm.text_data import TextData

    torch.manual_seed(0)
    linear = torch.nn.Linear(32, 8)
    x = (torch.randn(5, 32) * torch.linspace(0.1, 30, 32)).requires_grad_()
    with int8_inputs(linear, ["weight"], straight_through=True):
        y = linear(x)
    assert torch.equal(y, linear(rounded_rows(x.detach())))
    y.sum().backward()
    assert torch.allclose(x.grad, linear.weight.sum(0).expand(5, 32))

    loaded = load_lm(random_lm_dir("llama"))
    windows = TextData(calibration_windows=8, window=64).windows(loaded.tokenizer)[0]
    scheme = QuantizeConfig(mode="qat", dtype="int4", epochs=1, batch_size=4, lr=2e-4).scheme
    start = quantize_lm(loaded, WeightOnlyPlan(bits=4, group_size=32, algorithm="rtn",
                                               symmetric=True), None)
    _, facts = train(loaded, start, windows, scheme, Progress(quiet=True), ("onnx", "tflite"))
    assert facts["inputs_rounded_as"] == "tflite"
    assert not any(m._forward_pre_hooks for m in loaded.model.modules())
    _, alone = train(loaded, start, windows, scheme, Progress(quiet=True), ("onnx",))
    assert alone["inputs_rounded_as"] is None and alone["loss_first"] < facts["loss_first"]

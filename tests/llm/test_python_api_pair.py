"""`cz.compress((model, tokenizer), ...)`: the pair `module:function` may return works in
Python too (it failed: "cannot compress a tuple"), and the caller's model keeps its modules'
training flags, after a run and after a failed one (it was left in eval mode)."""
from __future__ import annotations

import pytest

import compressor as cz
from compressor.errors import DataError


@pytest.fixture
def pair(random_lm_dir):
    """An in-memory tiny Llama with no tokenizer findable from it, and its tokenizer; one
    module in eval mode, the rest training."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = random_lm_dir("llama")
    model = AutoModelForCausalLM.from_pretrained(folder)
    model.config._name_or_path = ""   # only the pair's tokenizer can cut the text
    model.train()
    model.model.layers[0].mlp.eval()
    return model, AutoTokenizer.from_pretrained(folder)


def _flags(model):
    return {name: module.training for name, module in model.named_modules()}


@pytest.mark.slow
def test_a_model_and_tokenizer_pair_compresses_and_keeps_its_modes(pair, tmp_path):
    model, tokenizer = pair
    before = _flags(model)
    result = cz.compress((model, tokenizer), recipe="fp16", data=cz.TextData(eval_windows=4),
                         out_dir=tmp_path / "out", formats=("onnx",), latency=False)
    assert result.exit_code == 0, result.report["failures"]
    assert result.report["model"] == "LlamaForCausalLM"
    assert _flags(model) == before


def test_a_failed_run_keeps_the_callers_modes_too(pair, tmp_path):
    model, tokenizer = pair
    before = _flags(model)
    with pytest.raises(DataError, match="missing.txt"):
        cz.compress((model, tokenizer), recipe="fp16", data=str(tmp_path / "missing.txt"),
                    out_dir=tmp_path / "out", formats=("onnx",), latency=False)
    assert _flags(model) == before

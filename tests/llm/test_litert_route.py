"""The TFLite route of a causal LM (backends/llm/litert.py) and its LiteRT runtime
(runtimes/litert_lm.py): tiny random Llama 3-style model (int4, tied embeddings, llama3 RoPE
scaling, widths 96 / 160), Phi-3 (float16, untied,
fused qkv / gate_up) and Gemma 2 (int8, softcapped tied head, prefill shorter than the
windows) converted once each by litert-torch's export_hf route; logits and greedy generation
with the KV cache against torch computing with the same (dequantized) integers, and the
integers read back.

A conversion costs ~40 s of CPU even for these 2-layer models (torch.export and lowering of
two signatures, then the converter), so there are three, shared per module.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from compressor.errors import BackendUnavailableError

CONTEXT = 64
WINDOWS = np.random.default_rng(0).integers(4, 512, (3, 40))   # the tokenizer's 512 ids


def _loaded(folder, quantized=None):
    import torch
    import transformers

    from compressor.backends.llm.model import LoadedLm

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    return LoadedLm(model=model, tokenizer=tokenizer, source=folder,
                    quantized=quantized(model) if quantized else {})


def _symmetric(bits, group=None):
    """Every weight compress stores in integers, on LiteRT's own grid (symmetric round to
    nearest: int4 per block of `group` with bfloat16-exact scales, int8 per channel), as a
    quantizer aiming at this route would make them."""
    def quantize(model):
        import torch

        from compressor.backends.llm.litert_grid import round_to_nearest
        from compressor.backends.llm.model import QuantizedLinear
        from compressor.backends.llm.quantize import quantized_weight_names

        params = dict(model.named_parameters(remove_duplicate=False))
        quantized = {}
        for name in quantized_weight_names(model):
            block = group or params[name].shape[1]
            grid = round_to_nearest(params[name].detach().numpy(), bits, block)
            quantized[name] = QuantizedLinear(
                q=torch.from_numpy((grid.values.astype(np.int16) + 2 ** (bits - 1)).astype(np.uint8)),
                scales=torch.from_numpy(grid.scales),
                zeros=torch.full(grid.scales.shape, 2 ** (bits - 1), dtype=torch.uint8),
                bits=bits, group_size=block)
        return quantized
    return quantize


def _export(loaded, scheme, tmp_path, monkeypatch=None, prefill=None):
    import time

    from compressor.backends.llm import litert
    from compressor.core.context import Context, Data, ModelState
    from compressor.core.progress import Progress

    if prefill:
        monkeypatch.setattr(litert, "PREFILL_MAX", prefill)
    ctx = Context(data=Data(), progress=Progress(quiet=True), workdir=tmp_path / "work",
                  context=CONTEXT)
    start = time.perf_counter()
    path = litert.write_litert_model(ModelState(model=loaded, scheme=scheme), scheme,
                                     tmp_path / "model.tflite", ctx)
    print(f"\nlitert conversion: {time.perf_counter() - start:.1f} s, {litert.LAST_RUN}")
    return path, ctx


def _torch_reference(loaded, prompt, new_tokens=16):
    from compressor.backends.llm import LlmBackend

    backend = LlmBackend()
    outputs = backend.predict(loaded, WINDOWS)
    return outputs, backend.generate(loaded, prompt, new_tokens)


@pytest.fixture(scope="module")
def llama_int4(random_lm_dir, tmp_path_factory):
    from compressor.schemes import Int4WeightOnly

    loaded = _loaded(random_lm_dir("llama3"), _symmetric(4, 32))
    path, ctx = _export(loaded, Int4WeightOnly(), tmp_path_factory.mktemp("litert-int4"))
    return loaded, path, ctx


@pytest.fixture(scope="module")
def phi3_fp16(random_lm_dir, tmp_path_factory):
    from compressor.schemes import Float16

    loaded = _loaded(random_lm_dir("phi3"))
    loaded.model.half().float()        # float16 values: what a float16 file holds exactly
    path, ctx = _export(loaded, Float16(), tmp_path_factory.mktemp("litert-fp16"))
    return loaded, path, ctx


@pytest.fixture(scope="module")
def gemma2_int8(random_lm_dir, tmp_path_factory):
    from compressor.schemes import Int8WeightOnly

    monkeypatch = pytest.MonkeyPatch()
    loaded = _loaded(random_lm_dir("gemma2"), _symmetric(8))
    try:
        path, ctx = _export(loaded, Int8WeightOnly(), tmp_path_factory.mktemp("litert-int8"),
                            monkeypatch, prefill=16)
    finally:
        monkeypatch.undo()
    return loaded, path, ctx


def _agrees_with_torch(built, max_logprob_diff):
    from compressor.runtimes.lm import open_lm_runtime

    loaded, path, _ = built
    runtime = open_lm_runtime(path, threads=1)
    assert runtime.name == "litert" and runtime.context == CONTEXT
    prompt = WINDOWS[0, :8].tolist()
    reference, greedy = _torch_reference(loaded, prompt)
    outputs = runtime.predict(WINDOWS)
    assert outputs["token_logprob"].shape == (3, 39) and outputs["next_token"].shape == (3, 40)
    diff = np.abs(outputs["token_logprob"] - reference["token_logprob"])
    print(f"\nlog-prob |diff| max {diff.max():.2e} mean {diff.mean():.2e}")
    assert diff.max() < max_logprob_diff
    assert (outputs["next_token"] == reference["next_token"]).mean() >= 0.95
    streamed = []
    assert runtime.generate(prompt, 16, on_token=streamed.append) == greedy == streamed
    return runtime


@pytest.mark.slow
def test_int4_llama_computes_its_integers_and_generates_like_torch(llama_int4):
    # the rest of the difference: LiteRT quantizes activations to int8 per token at run time
    runtime = _agrees_with_torch(llama_int4, 0.02)
    # 2 layers x (K, V) x 2 KV heads x head_dim 16 x context x float32
    assert runtime.kv_cache_bytes == 2 * 2 * 2 * 16 * CONTEXT * 4
    assert llama_int4[2].record.notes["tflite_weights"] == {
        "as_quantized": 15, "scales_rounded_to_bf16": [], "rounded_again": [], "left_float": [],
        "stored_twice": []}


@pytest.mark.slow
def test_int4_file_holds_the_integers_and_scales_it_was_given(llama_int4):
    from compressor.runtimes import inspect_artifact
    from compressor.runtimes.tflite import _open
    from compressor.runtimes.weights import weight_share_at

    loaded, path, _ = llama_int4
    info = inspect_artifact(path)
    share, _ = weight_share_at(info.weights, 4)
    assert share >= 0.9 and info.weight_dtypes["int4"] > 0.99
    # the tied table (embedding lookup and lm_head: one copy) read back from the file
    head = loaded.quantized[next(n for n in loaded.quantized if "embed" in n or "lm_head" in n)]
    interpreter, _ = _open(path, delegates=False)
    table = next(t for t in interpreter.get_tensor_details() if tuple(t["shape"]) == head.shape
                 and t["quantization_parameters"].get("block_size") == 32)
    stored = interpreter.get_tensor(table["index"])
    np.testing.assert_array_equal(stored, head.q.numpy().astype(np.int16) - 8)
    np.testing.assert_array_equal(table["quantization_parameters"]["scales"].reshape(head.shape[0], -1),
                                  head.scales.numpy().astype(np.float16))


@pytest.mark.slow
def test_the_artifact_carries_its_tokenizer_and_times_itself(llama_int4, random_lm_dir):
    from compressor.runtimes.litert_lm import LiteRtLm

    runtime = LiteRtLm(llama_int4[1], threads=1)
    files = runtime.tokenizer_files()
    assert files["tokenizer.json"] == (random_lm_dir("llama") / "tokenizer.json").read_bytes()
    speed = runtime.speed(prefill_tokens=512, decode_tokens=16)
    assert speed["prefill_tokens"] == CONTEXT - 16 and speed["decode_tokens"] == 16
    assert speed["prefill_ms"] > 0 and speed["decode_tokens_per_s"] > 0
    assert 10e6 < speed["peak_rss_bytes"] < 400e6 and speed["threads"] == 1


@pytest.mark.slow
def test_float16_phi3_untied_embedding_and_fused_projections(phi3_fp16):
    from compressor.runtimes import inspect_artifact

    _agrees_with_torch(phi3_fp16, 1e-4)
    assert inspect_artifact(phi3_fp16[1]).weight_dtypes["float16"] > 0.99


@pytest.mark.slow
def test_int8_gemma2_softcapped_head_and_windows_longer_than_the_prefill(gemma2_int8):
    """prefill_16 with 40-token windows: three chunks threading the cache, as generation
    does. The converter folds Gemma 2's logit softcap (1/30) into the tied lm_head, so the
    table is stored twice: once for the lookup, once with its scales / 30 for the head."""
    from compressor.runtimes import inspect_artifact
    from compressor.runtimes.litert_lm import LiteRtLm
    from compressor.runtimes.weights import weight_share_at

    loaded, path, ctx = gemma2_int8
    _agrees_with_torch(gemma2_int8, 0.02)
    assert LiteRtLm(path).prefill_lengths == [16]
    share, _ = weight_share_at(inspect_artifact(path).weights, 8)
    assert share >= 0.9
    notes = ctx.record.notes["tflite_weights"]
    assert notes["as_quantized"] == len(loaded.quantized) == 15
    assert notes["stored_twice"] == ["model.embed_tokens.weight"] and not notes["left_float"]


@pytest.mark.parametrize("config, reason", [
    ({"model_type": "mamba", "hidden_size": 64}, "mamba has no attention layers"),
    ({"model_type": "llama", "num_attention_heads": 4,
      "rope_parameters": {"rope_type": "dynamic", "factor": 2.0}},
     "cannot export dynamic RoPE (llama)"),
])
def test_families_the_route_cannot_take_are_refused_before_converting(config, reason, tmp_path):
    from types import SimpleNamespace

    from compressor.backends.llm import litert
    from compressor.backends.llm.model import LoadedLm
    from compressor.core.context import Context, Data, ModelState
    from compressor.core.progress import Progress
    from compressor.schemes import Float32

    model = SimpleNamespace(config=SimpleNamespace(**config))
    ctx = Context(data=Data(), progress=Progress(quiet=True), workdir=tmp_path)
    with pytest.raises(BackendUnavailableError, match=re.escape(reason)) as error:
        litert.write_litert_model(ModelState(model=LoadedLm(model, None)), Float32(),
                                  tmp_path / "model.tflite", ctx)
    assert "export onnx instead" in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "model.tflite").exists()


def test_grids_litert_computes_with_keep_their_integers():
    import torch

    from compressor.backends.llm.grid import rtn
    from compressor.backends.llm.litert_grid import (EXACT, ROUNDED_AGAIN, SCALES_ROUNDED,
                                                     kernel_scales, on_litert_grid)

    w = torch.randn(8, 64)
    symmetric = rtn(w, 4, 32, symmetric=True)   # our symmetric grid: bfloat16-exact scales
    stored, how = on_litert_grid(symmetric)
    assert how == EXACT
    np.testing.assert_array_equal(stored.values, symmetric.q.numpy().astype(np.int16) - 8)
    # absmax / 7 scales as other quantizers leave them are not bfloat16 numbers
    groups = w.reshape(8, 2, 32)
    plain = type(symmetric)(symmetric.q, groups.abs().amax(-1) / 7, symmetric.zeros, 4, 32)
    assert on_litert_grid(plain)[1] == SCALES_ROUNDED
    on_bf16 = type(symmetric)(symmetric.q, torch.from_numpy(kernel_scales(plain.scales.numpy())),
                              symmetric.zeros, 4, 32)
    assert on_litert_grid(on_bf16)[1] == EXACT
    per_channel, how = on_litert_grid(rtn(w, 8, 64, symmetric=True))
    assert how == EXACT and per_channel.scales.shape == (8, 1) and per_channel.block == 64
    # asymmetric zero points / int8 per group: rounded again onto LiteRT's grid, close to w
    for weight in (rtn(w, 4, 32), rtn(w, 8, 32)):
        again, how = on_litert_grid(weight)
        assert how == ROUNDED_AGAIN and again.values.min() >= -(2 ** (weight.bits - 1))
        restored = again.values * np.repeat(again.scales, again.block, axis=1)
        step = np.repeat(again.scales, again.block, axis=1)
        assert np.all(np.abs(restored - weight.dequantize().numpy()) <= step / 2 + 1e-6)


def test_config_json_files_name_their_heads_as_their_family_does():
    """check_family reads raw config.json files too (the route check before any work): GPT-2's
    heads are `n_head` there, which only its config class maps to num_attention_heads."""
    from types import SimpleNamespace

    from compressor.backends.llm.litert import check_family

    check_family(SimpleNamespace(model_type="gpt2", n_head=12, n_embd=768))
    with pytest.raises(BackendUnavailableError, match="has no attention layers"):
        check_family(SimpleNamespace(model_type="mamba", hidden_size=64))

"""The GPTQ checkpoint the ONNX route hands onnxruntime-genai's builder, and our re-pack of
it into MatMulNBits tensors: packing read back by hand, widths that do not pack refused."""
from __future__ import annotations

import numpy as np
import pytest

from compressor.errors import BackendUnavailableError


def quantized(n: int, k: int, bits: int, group: int, seed: int = 0):
    import torch

    from compressor.backends.llm.model import QuantizedLinear

    g = torch.Generator().manual_seed(seed)
    top = 2 ** bits
    return QuantizedLinear(torch.randint(0, top, (n, k), generator=g, dtype=torch.uint8),
                           torch.rand(n, k // group, generator=g) + 0.01,
                           torch.randint(0, top, (n, k // group), generator=g, dtype=torch.uint8),
                           bits, group)


@pytest.mark.parametrize("bits", [4, 8])
def test_gptq_tensors_pack_our_integers_as_gptq_does(bits):
    from compressor.backends.llm.gptq_format import gptq_tensors

    weight = quantized(16, 64, bits, 32)
    tensors = gptq_tensors("model.layers.0.mlp.up_proj.weight", weight)
    base = "model.layers.0.mlp.up_proj"
    pack, mask = 32 // bits, (1 << bits) - 1
    qweight = tensors[f"{base}.qweight"].view(np.uint32)
    assert qweight.shape == (64 // pack, 16)
    # value j of word r is input k = r * pack + j, at bits*j
    unpacked = np.stack([(qweight >> (bits * j)) & mask for j in range(pack)], 1).reshape(64, 16)
    assert (unpacked.T == weight.q.numpy()).all()
    qzeros = tensors[f"{base}.qzeros"].view(np.uint32)        # [K/g, N/pack], zero - 1
    zeros = np.stack([(qzeros >> (bits * j)) & mask for j in range(pack)], -1).reshape(2, 16)
    assert (((zeros + 1) & mask).T == weight.zeros.numpy()).all()
    assert (tensors[f"{base}.scales"] == weight.scales.numpy().T).all()
    assert tensors[f"{base}.scales"].dtype == np.float32
    assert (tensors[f"{base}.g_idx"] == np.arange(64) // 32).all()


@pytest.mark.parametrize("bits", [4, 8])
def test_ort_tensors_are_the_matmulnbits_layout(bits):
    from compressor.backends.llm.genai_repack import ort_tensors
    from compressor.backends.llm.gptq_format import gptq_tensors

    weight = quantized(24, 96, bits, 32, seed=1)
    t = gptq_tensors("lm_head.weight", weight)
    b, zero_points, scales = ort_tensors(t["lm_head.qweight"], t["lm_head.qzeros"],
                                         t["lm_head.scales"], bits, 32)
    assert b.shape == (24, 3, 32 * bits // 8) and b.dtype == np.uint8
    flat = b.reshape(24, -1)
    q = np.stack([flat & 0xF, flat >> 4], -1).reshape(24, -1) if bits == 4 else flat
    assert (q == weight.q.numpy()).all()
    zp = zero_points.reshape(24, -1)
    zp = np.stack([zp & 0xF, zp >> 4], -1).reshape(24, -1)[:, :3] if bits == 4 else zp
    assert (zp == weight.zeros.numpy()).all()        # 3 blocks: the last byte half padding
    assert (scales.reshape(24, 3) == weight.scales.numpy()).all()


@pytest.mark.parametrize("n, k, fix", [(12, 64, "out features a multiple of 8"),
                                       (16, 48, "multiple of group_size 32")])
def test_widths_that_do_not_pack_are_refused_in_one_line(n, k, fix):
    import torch

    from compressor.backends.llm.gptq_format import gptq_tensors
    from compressor.backends.llm.model import QuantizedLinear

    groups = max(1, k // 32)
    weight = QuantizedLinear(torch.zeros(n, k, dtype=torch.uint8), torch.ones(n, groups),
                             torch.zeros(n, groups, dtype=torch.uint8), 4, 32)
    with pytest.raises(BackendUnavailableError) as caught:
        gptq_tensors("model.layers.0.mlp.up_proj.weight", weight)
    assert fix in str(caught.value) and "\n" not in str(caught.value)


def _gemma3_config(hub_form: bool) -> dict:
    """A tiny Gemma 3 config.json's dict: transformers 5's form (rope_parameters per layer
    type) or the Hub's original one (rope_theta, rope_local_base_freq, rope_scaling)."""
    config = {"model_type": "gemma3_text", "vocab_size": 512, "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "sliding_window": 64}
    if hub_form:
        return {**config, "rope_theta": 1e6, "rope_local_base_freq": 1e4, "rope_scaling": None,
                "sliding_window_pattern": 2}
    return {**config, "layer_types": ["sliding_attention", "full_attention"],
            "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}


@pytest.mark.parametrize("hub_form", [False, True])
def test_the_builder_reads_gemma3_rope_in_either_config_form(tmp_path, hub_form):
    """onnxruntime-genai 0.18's builder reads rope_parameters["rope_type"] and
    rope_local_base_freq off the config AutoConfig gives it; transformers 5 nests Gemma 3's
    RoPE per layer type whichever form config.json has (KeyError 'rope_type'). The config the
    builder reads carries the global layers' RoPE flat beside the per-type entries, and
    transformers reads it back the same."""
    import json

    from transformers import AutoConfig

    from compressor.backends.llm.gptq_format import builder_config

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "config.json").write_text(json.dumps(_gemma3_config(hub_form)))
    model_config = AutoConfig.from_pretrained(tmp_path / "in")   # what the loaded model holds
    written = builder_config(model_config.to_dict(), "Gemma3ForCausalLM")
    assert written["architectures"] == ["Gemma3ForCausalLM"]
    rope = written["rope_parameters"]
    assert (rope["rope_type"], rope["rope_theta"], rope["rope_local_base_freq"]) == (
        "default", 1e6, 1e4)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "config.json").write_text(json.dumps(written))
    read = AutoConfig.from_pretrained(tmp_path / "out")              # what the builder reads
    assert read.rope_parameters["rope_type"] == "default"
    assert read.rope_parameters["rope_local_base_freq"] == 1e4
    assert read.rope_parameters["sliding_attention"] == model_config.rope_parameters[
        "sliding_attention"]
    assert read.rope_parameters["full_attention"] == model_config.rope_parameters[
        "full_attention"]


def test_a_flat_rope_config_goes_to_the_builder_as_it_is():
    from compressor.backends.llm.gptq_format import builder_config

    config = {"model_type": "llama", "layer_types": ["full_attention"] * 2,
              "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}}
    assert builder_config(config, "LlamaForCausalLM") == {**config,
                                                          "architectures": ["LlamaForCausalLM"]}

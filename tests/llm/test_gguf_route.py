"""The GGUF route (`--format gguf`): our integers written as llama.cpp's blocks without a second
rounding, the file run in llama.cpp itself (the xllamacpp wheel) for perplexity, agreement,
generation and speed, read back by `compress inspect`, run by `compress generate`, and taken
back in as a model that keeps its integers."""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")
pytest.importorskip("xllamacpp")

import compressor as cz  # noqa: E402
from compressor.backends.llm import gguf_pack, grid  # noqa: E402
from compressor.backends.llm.gguf_write import write_gguf_model  # noqa: E402
from compressor.backends.llm.load import load_lm  # noqa: E402
from compressor.backends.llm.quantize import WeightOnlyPlan, quantize_lm  # noqa: E402
from compressor.runtimes.llamacpp import LlamaCppLm  # noqa: E402
from compressor.schemes import Int4WeightOnly  # noqa: E402
from support.gguf_readback import assert_holds  # noqa: E402


def test_q4_0_and_q8_0_hold_our_integers_exactly(random_lm_dir, tmp_path):
    """Every int4 integer and scale in the file is ours (llama's q / k rows permuted as llama.cpp
    wants them, then put back here); the matrices an int4 recipe keeps at int8 are Q8_0 with
    our integers too."""
    loaded = load_lm(random_lm_dir("llama"))
    quantized = quantize_lm(loaded, WeightOnlyPlan(bits=4, group_size=32, algorithm="rtn",
                                                   symmetric=True), None)
    down = "model.layers.1.mlp.down_proj.weight"
    quantized[down] = grid.int8_rows(loaded.model.state_dict()[down], 32)
    from compressor.core.context import Context, Data, ModelState
    from compressor.core.progress import Progress

    ctx = Context(data=Data(), progress=Progress(quiet=True), workdir=tmp_path, context=128)
    state = ModelState(model=loaded.with_quantized(quantized), scheme=Int4WeightOnly())
    path = write_gguf_model(state, Int4WeightOnly(), tmp_path / "model.gguf", ctx)
    assert assert_holds(path, quantized, loaded.config) == 15


def test_a_scale_float16_cannot_hold_is_written_f16_and_other_grids_rounded_again():
    weight = torch.randn(8, 64)
    tiny = grid.rtn(weight * 1e-5, 4, 32, symmetric=True)   # scales ~ 4e-6 < float16's normal
    blocks = gguf_pack.as_blocks(tiny)
    assert blocks.ggml_type == gguf_pack.F16 and not blocks.exact
    assert "normal range" in blocks.how
    np.testing.assert_allclose(blocks.data.astype(np.float32), tiny.dequantize().numpy(),
                               atol=1e-7)
    asymmetric_int8 = grid.rtn(weight, 8, 32)       # zero points: Q8_0 has none
    again = gguf_pack.as_blocks(asymmetric_int8)
    assert (again.ggml_type, again.exact, again.how) == (gguf_pack.Q8_0, False, "rounded again")
    computed = gguf_pack.as_computed(asymmetric_int8).dequantize().numpy()
    reference = gguf.quants.dequantize(again.data, gguf.GGMLQuantizationType.Q8_0)
    assert np.array_equal(computed, reference)
    g128 = gguf_pack.as_blocks(grid.rtn(torch.randn(4, 256), 4, 128, symmetric=True))
    assert g128.ggml_type == gguf_pack.Q4_0 and g128.exact   # a group of 128 is 4 blocks


@pytest.fixture(scope="module")
def int4_gguf(int4_gguf_run):
    return int4_gguf_run


@pytest.mark.slow
def test_int4_gguf_runs_in_llama_cpp_within_the_gate(int4_gguf, trained_lm_dir):
    out, result, report = int4_gguf
    assert result.returncode == 0, result.stderr[-2000:]
    (row,) = report["artifacts"]
    assert (row["format"], row["runtime"], row["path"]) == ("gguf", "llama.cpp", "model.gguf")
    assert 0 < row["perplexity_increase"] <= 0.05
    assert row["top1_agreement"] >= 0.8
    assert row["decode_tokens_per_s"] > 0 and row["kv_cache_bytes"] > 0
    assert row["weight_dtypes"].get("int4", 0) >= 0.5
    # a fifth of a float16 file's bytes or less, plus the tokenizer in its metadata
    assert row["size_bytes"] <= 0.6 * report["baseline"]["fp16_bytes"]
    assert (out / "model.gguf").stat().st_size == row["size_bytes"]


@pytest.mark.slow
def test_inspect_and_generate_read_the_gguf(int4_gguf, cli):
    out = int4_gguf[0]
    inspected = cli("inspect", str(out / "model.gguf"), "--json")
    assert inspected.returncode == 0, inspected.stderr[-1000:]
    facts = json.loads(inspected.stdout)
    assert facts["format"] == "gguf" and facts["storage"]["Q4_0"]["bits_per_weight"] == 4.5
    assert facts["storage"]["F32"]["tensors"] >= 5    # norms
    generated = cli("generate", str(out / "model.gguf"), "--prompt", "It was the best of",
                    "--max-new-tokens", "8", "--threads", "1")
    assert generated.returncode == 0, generated.stderr[-1000:]
    assert "tokens/s (llama.cpp" in generated.stderr and generated.stdout.strip()


@pytest.mark.slow
def test_our_gguf_goes_back_in_and_keeps_its_integers(int4_gguf, tmp_path):
    ours = int4_gguf[0] / "model.gguf"
    result = cz.compress(str(ours), recipe="int4", data="text", out_dir=tmp_path / "again",
                         formats=("gguf",), latency=False)
    assert result.exit_code == 0, result.report["failures"]
    before, after = gguf.GGUFReader(str(ours)), gguf.GGUFReader(str(tmp_path / "again" / "model.gguf"))
    q4 = {t.name: np.asarray(t.data) for t in before.tensors
          if t.tensor_type == gguf.GGMLQuantizationType.Q4_0}
    again = {t.name: np.asarray(t.data) for t in after.tensors}
    assert len(q4) >= 5   # the rest are the int8 matrices the mix kept (Q8_0)
    assert all(np.array_equal(again[name], data) for name, data in q4.items())


@pytest.mark.slow
def test_int8_and_fp16_gguf_track_the_float_model(trained_lm_dir, tmp_path):
    rows = {}
    for recipe in ("int8", "fp16"):
        result = cz.compress(str(trained_lm_dir), recipe=recipe, data="text",
                             out_dir=tmp_path / recipe, formats=("gguf",), latency=False)
        assert result.exit_code == 0, result.report["failures"]
        (rows[recipe],) = result.report["artifacts"]
    assert abs(rows["int8"]["perplexity_increase"]) <= 0.005
    assert rows["int8"]["weight_dtypes"].get("int8", 0) >= 0.9
    assert abs(rows["fp16"]["perplexity_increase"]) <= 0.001
    assert rows["fp16"]["top1_agreement"] >= 0.99
    assert rows["fp16"]["weight_dtypes"].get("float16", 0) >= 0.9


GGUF_FAMILIES = ["llama", "llama3", "mistral", "qwen2", "gemma", "gemma2", "gemma3_text", "granite",
                 "phi3", "olmo2", "qwen3_moe", "mixtral", "gpt2", "gpt_neox"]


@pytest.mark.parametrize("family", GGUF_FAMILIES)
def test_llama_cpp_computes_each_family_as_transformers_does(family, lm_tokenizer, tmp_path):
    """Float32 weights: the file's names, layouts and metadata are what llama.cpp's graph for
    the family expects (q / k row order, Gemma's 1 + w norms, Llama 3's RoPE factors,
    Granite's multipliers, Gemma 2's soft-capping): its log-probabilities are transformers'."""
    from compressor.backends.llm.gguf_write import write_file
    from support import tiny_lm

    model = tiny_lm.random_lm(lm_tokenizer, family)
    path = write_file(model, lm_tokenizer, tmp_path / "f32.gguf",
                      lambda _, t: (t.detach().float().numpy(), gguf_pack.F32, "float"),
                      context=128)
    window = np.asarray([lm_tokenizer(tiny_lm.builtin_texts()[1])["input_ids"][:48]])
    outputs = LlamaCppLm(path, threads=1).predict(window)
    with torch.no_grad():
        logits = model(torch.as_tensor(window)).logits.float()
    expected = torch.log_softmax(logits, -1)[0, torch.arange(47), window[0, 1:]].numpy()
    assert np.abs(outputs["token_logprob"][0] - expected).max() < 2e-3
    assert (outputs["next_token"] == logits.argmax(-1).numpy()).mean() >= 0.97


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2"])   # qwen2: biases, no BOS; the rest: F32 above
def test_int4_gguf_of_other_families(family, random_lm_dir, tmp_path):
    result = cz.compress(str(random_lm_dir(family)), recipe="int4", data="text",
                         out_dir=tmp_path / "out", formats=("gguf",), latency=False)
    assert result.exit_code == 0, result.report["failures"]
    (row,) = result.report["artifacts"]
    assert row["runtime"] == "llama.cpp"
    assert row["weight_dtypes"].get("int4", 0) >= 0.5
    assert abs(row["perplexity_increase"]) <= 0.10
    assert row["top1_agreement"] >= 0.6


def test_a_damaged_gguf_artifact_is_one_error_line(tmp_path, cli):
    broken = tmp_path / "model.gguf"
    broken.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 40)
    result = cli("generate", str(broken), "--prompt", "hello")
    assert result.returncode == 2
    assert result.stderr.count("error:") == 1 and "Traceback" not in result.stderr
    with pytest.raises(Exception, match="not a readable GGUF"):
        LlamaCppLm(broken)


def test_a_family_llama_cpp_cannot_run_is_refused_before_any_work(random_lm_dir, cli, tmp_path):
    # SmolLM3 without RoPE in layer 1 (llama.cpp's smollm3: only every 4th layer)
    result = cli("--recipe", "int4", str(random_lm_dir("smollm3")), "--format", "gguf",
                 "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert result.stderr.count("error:") == 1 and "no_rope_layers" in result.stderr
    assert "tflite" in result.stderr and not (tmp_path / "out").exists()

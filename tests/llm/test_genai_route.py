"""The ONNX route of a language model: onnxruntime-genai's builder fed our integers as a GPTQ
checkpoint, its folder run in onnxruntime / onnxruntime-genai (runtimes/genai.py).

Numbers: the folder's logits equal torch's with the same (dequantized) weights up to the
int8 activations of MatMulNBits accuracy_level 4; the integers in the file are ours, bit for
bit; greedy generation with the KV cache equals torch's; >= 90% of the weight bytes are 4-bit.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from compressor.errors import BackendUnavailableError
from support.genai_builds import genai_build

pytestmark = pytest.mark.slow

CONTEXT = 96          # the KV cache the test folders are sized to (< max_position_embeddings 512)
# accuracy_level 4 quantizes activations to int8 inside MatMulNBits: measured, log-probabilities
# differ from torch's by <= 0.005 on the random tiny models and <= 0.057 (mean 0.01) on the
# trained one; with accuracy_level 0 the route matches torch to 4e-7 (integers, scales exact).
LOGPROB_ATOL, LOGPROB_MEAN = 0.1, 0.025


def torch_outputs(loaded, windows: np.ndarray) -> dict:
    from compressor.backends.llm import LlmBackend

    return LlmBackend().predict(loaded, windows)


def eval_windows(tokenizer, count: int = 4, length: int = 64) -> np.ndarray:
    from support import tiny_lm

    ids = tokenizer(tiny_lm.builtin_texts()[1], add_special_tokens=False)["input_ids"]
    return np.array([ids[i * length:(i + 1) * length] for i in range(count)], dtype=np.int64)


@pytest.fixture(scope="module")
def llama_int4(tmp_path_factory, trained_lm_dir):
    return genai_build(tmp_path_factory, trained_lm_dir, "int4", context=CONTEXT)


@pytest.mark.parametrize("family", ["llama", "llama3", "qwen2", "gemma2", "phi3", "mistral"])
def test_int4_folder_computes_what_torch_computes_with_our_integers(tmp_path_factory,
                                                                    random_lm_dir, family):
    from compressor.runtimes.lm import open_lm_runtime

    build = genai_build(tmp_path_factory, random_lm_dir(family), "int4", context=CONTEXT)
    assert sorted(p.name for p in build.folder.iterdir()) == [
        "chat_template.jinja", "genai_config.json", "model.onnx", "model.onnx.data",
        "tokenizer.json", "tokenizer_config.json"]
    runtime = open_lm_runtime(build.folder, threads=1)
    windows = eval_windows(build.loaded.tokenizer, count=2)
    ours, ref = runtime.predict(windows), torch_outputs(build.loaded, windows)
    assert ours["token_logprob"].shape == (2, 63) and ours["next_token"].shape == (2, 64)
    assert_close(ours, ref)
    assert_integers_are_ours(build, "lm_head.weight", "/lm_head/MatMulNBits")
    assert_integers_are_ours(build, "model.layers.1.self_attn.o_proj.weight",
                             "/model/layers.1/attn/o_proj/MatMulNBits")


def assert_close(ours: dict, ref: dict) -> None:
    diff = np.abs(ours["token_logprob"] - ref["token_logprob"])
    print(f"logprob diff max {diff.max():.4f} mean {diff.mean():.4f}, top-1 agreement "
          f"{np.mean(ours['next_token'] == ref['next_token']):.3f}")
    assert diff.max() < LOGPROB_ATOL and diff.mean() < LOGPROB_MEAN
    assert np.mean(ours["next_token"] == ref["next_token"]) >= 0.95


def assert_integers_are_ours(build, param: str, node_name: str) -> None:
    """The MatMulNBits node's B / scales / zero points unpack to exactly our q / scales / zeros
    (no zero-point input: ours are all the default, the grid's middle)."""
    import onnx
    from onnx import numpy_helper

    from compressor.backends.llm.gptq_format import linear_weights

    model = onnx.load(str(build.folder / "model.onnx"))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    node = next(n for n in model.graph.node if n.name == node_name)
    ours = linear_weights(build.loaded)[param]   # a tied head may be keyed by the embedding
    n, k = ours.shape

    def unpack(packed, columns):
        rows = packed.reshape(n, -1)
        if ours.bits == 4:
            rows = np.stack([rows & 0xF, rows >> 4], -1).reshape(n, -1)
        return rows[:, :columns]

    assert (unpack(inits[node.input[1]], k) == ours.q.numpy()).all()
    if len(node.input) > 3 and node.input[3]:
        assert (unpack(inits[node.input[3]], k // ours.group_size) == ours.zeros.numpy()).all()
    else:
        assert (ours.zeros == 2 ** (ours.bits - 1)).all()
    assert (inits[node.input[2]].reshape(n, -1) == ours.scales.numpy()).all()


def test_greedy_generation_with_the_kv_cache_equals_torch(llama_int4):
    from compressor.backends.llm import LlmBackend
    from compressor.runtimes.lm import open_lm_runtime

    runtime = open_lm_runtime(llama_int4.folder, threads=1)
    prompts = eval_windows(llama_int4.loaded.tokenizer, count=3, length=24)
    streamed: list[int] = []
    agree = []
    for prompt in prompts:
        ours = runtime.generate(prompt.tolist(), 16, on_token=streamed.append)
        ref = LlmBackend().generate(llama_int4.loaded, prompt.tolist(), 16)
        assert len(ours) == 16
        agree.append(np.mean(np.array(ours) == np.array(ref)))
    assert streamed[-16:] == ours
    assert np.mean(agree) >= 0.9, agree


def test_weight_bytes_are_4_bit_and_the_cache_is_sized_to_the_context(tmp_path_factory,
                                                                      llama_int4, random_lm_dir):
    from compressor.runtimes import inspect_artifact
    from compressor.runtimes.lm import open_lm_runtime
    from compressor.runtimes.weights import weight_share_at

    untied = genai_build(tmp_path_factory, random_lm_dir("phi3"), "int4", context=CONTEXT)
    for build in (llama_int4, untied):
        info = inspect_artifact(build.folder)
        share, floats = weight_share_at(info.weights, 4)
        assert share >= 0.9, floats
        assert info.size_bytes == sum(p.stat().st_size for p in build.folder.iterdir())
        assert info.weight_dtypes["int4"] > 0.95 and info.format == "onnx"
    embedding = [w for w in inspect_artifact(untied.folder).weights if "embed_tokens" in w.name]
    assert [(w.dtype, w.shape) for w in embedding] == [("int4", (512, 64))]   # ours, not float
    config = json.loads((llama_int4.folder / "genai_config.json").read_text())
    assert config["model"]["context_length"] == config["search"]["max_length"] == CONTEXT
    runtime = open_lm_runtime(llama_int4.folder, threads=1)
    assert runtime.context == CONTEXT
    assert runtime.kv_cache_bytes == 2 * 2 * 2 * 16 * CONTEXT * 4   # layers, K+V, heads, dim
    rotary = [w for w in _initializers(llama_int4.folder) if w[0] == "cos_cache"]
    assert rotary == [("cos_cache", [CONTEXT, 8])]   # cut from 512 rows to the context


def _weights(folder):
    from compressor.runtimes import inspect_artifact

    return inspect_artifact(folder).weights


def _initializers(folder):
    import onnx

    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    return [(t.name, list(t.dims)) for t in model.graph.initializer]


def test_int8_folder_stores_int8_weights(tmp_path_factory, trained_lm_dir):
    from compressor.runtimes import inspect_artifact
    from compressor.runtimes.lm import open_lm_runtime
    from compressor.runtimes.weights import weight_share_at

    build = genai_build(tmp_path_factory, trained_lm_dir, "int8", context=CONTEXT)
    assert weight_share_at(inspect_artifact(build.folder).weights, 8)[0] >= 0.9
    windows = eval_windows(build.loaded.tokenizer, count=2)
    ours = open_lm_runtime(build.folder, threads=1).predict(windows)
    assert_close(ours, torch_outputs(build.loaded, windows))
    assert_integers_are_ours(build, "lm_head.weight", "/lm_head/MatMulNBits")


@pytest.mark.parametrize("scheme, atol", [("fp32", 1e-4), ("fp16", 2e-2)])
def test_float_folders_match_torch(tmp_path_factory, trained_lm_dir, scheme, atol):
    from compressor.runtimes.lm import open_lm_runtime

    build = genai_build(tmp_path_factory, trained_lm_dir, scheme, context=CONTEXT)
    windows = eval_windows(build.loaded.tokenizer, count=2)
    runtime = open_lm_runtime(build.folder, threads=1)
    ours, ref = runtime.predict(windows), torch_outputs(build.loaded, windows)
    assert np.abs(ours["token_logprob"] - ref["token_logprob"]).max() < atol
    assert np.mean(ours["next_token"] == ref["next_token"]) >= 0.95
    assert len(runtime.generate(windows[0, :16].tolist(), 8)) == 8   # decode steps run too
    stored = {w.dtype for w in _weights(build.folder) if w.size >= 1024}
    assert stored == {"float32" if scheme == "fp32" else "float16"}


def test_speed_is_measured_in_a_lean_child(llama_int4):
    from compressor.runtimes.lm import open_lm_runtime

    speed = open_lm_runtime(llama_int4.folder, threads=1).speed(prefill_tokens=512,
                                                                  decode_tokens=16)
    assert speed["threads"] == 1 and speed["decode_tokens"] == 16
    assert speed["prefill_tokens"] == CONTEXT - 16              # capped to the context
    assert speed["prefill_ms"] > 0 and speed["decode_tokens_per_s"] > 10
    assert 10 * 2**20 < speed["peak_rss_bytes"] < 250 * 2**20    # no torch in the child


def test_our_repack_writes_the_bytes_the_builder_writes(tmp_path, random_lm_dir):
    """genai_repack.py replaces the builder's GPTQ re-pack: same artifact, byte for byte
    (fused qkv / gate_up of Phi-3, 8 bits)."""
    import onnx
    from onnx import numpy_helper

    from compressor.backends.llm.genai_builder import run_builder
    from compressor.backends.llm.gptq_format import write_gptq_folder
    from support.genai_builds import quantized_lm

    source = write_gptq_folder(quantized_lm(random_lm_dir("phi3"), "int8", 32), tmp_path / "gptq")
    built = {}
    for fast in (True, False):
        out = tmp_path / f"out-{fast}"
        run_builder(source, out, "int4", tmp_path / "cache", tmp_path / "builder.log",
                    fast_repack=fast)
        model = onnx.load(str(out / "model.onnx"))
        built[fast] = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert built[True].keys() == built[False].keys()
    for name, value in built[False].items():
        assert value.dtype == built[True][name].dtype and np.array_equal(value, built[True][name])


def test_the_builder_writes_nothing_to_the_console(tmp_path_factory, random_lm_dir, capfd):
    genai_build(tmp_path_factory, random_lm_dir("qwen2"), "int4", context=64)
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_a_family_the_builder_cannot_take_is_one_line(tmp_path, lm_tokenizer):
    import torch
    import transformers

    from compressor.backends.llm.genai import write_genai_folder
    from compressor.backends.llm.model import LoadedLm
    from compressor.core.context import Context, Data, ModelState
    from compressor.core.progress import Progress
    from compressor.schemes import Float32

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=len(lm_tokenizer), n_embd=32, n_layer=1, n_head=2)
    model = transformers.GPT2LMHeadModel(config).eval()
    ctx = Context(data=Data(), progress=Progress(quiet=True), workdir=tmp_path / "work")
    with pytest.raises(BackendUnavailableError) as caught:
        write_genai_folder(ModelState(model=LoadedLm(model, lm_tokenizer)), Float32(),
                           tmp_path / "model.onnx", ctx)
    message = str(caught.value)
    assert "\n" not in message and "GPT2LMHeadModel" in message and "tflite" in message


def test_model_onnx_names_no_commit_of_the_project_around_the_environment(llama_int4):
    """The builder stamps producer_version with `git rev-parse HEAD` beside its install: with
    the environment inside a checkout (this repository's .venv), model.onnx changed bytes at
    every commit of the checkout; the same input gives the same bytes."""
    import subprocess
    import sys

    import onnx

    model = onnx.load(str(llama_int4.folder / "model.onnx"), load_external_data=False)
    around = subprocess.run(["git", "rev-parse", "HEAD"], cwd=sys.prefix, capture_output=True,
                            text=True, check=False).stdout.strip()
    assert model.producer_version.startswith("0.")
    if around:   # an environment inside a git checkout: its commit must not be stamped
        assert around[:7] not in model.producer_version, model.producer_version


def test_the_builder_fix_for_smollm3_is_undone_after_the_build():
    """genai_builder.builder_fixes replaces SmolLM3Model.make_attention (its NoPE layers asked
    for a position_ids input the CPU graph does not have) on both names the builder's classes
    go by, only while the builder runs."""
    import importlib

    from compressor.backends.llm.genai_builder import builder_fixes

    classes = [importlib.import_module(f"{package}builders.smollm").SmolLM3Model
               for package in ("onnxruntime_genai.models.", "")]
    originals = [cls.__dict__["make_attention"] for cls in classes]
    with builder_fixes():
        assert all(cls.__dict__["make_attention"] is not original
                   for cls, original in zip(classes, originals))
    assert [cls.__dict__["make_attention"] for cls in classes] == originals

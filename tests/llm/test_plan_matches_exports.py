"""The plan's artifact bytes against the files compressor's ONNX exporter writes for the same
model: the byte accounting (compressor/llm/footprint.py LAYOUTS) is the exporter's, not a guess.

The export step runs directly (no validation): the recipe's quantize plan as `compress` makes it
(handlers.weight_only_plan: int4 groups of 32, int8 the widest group <= 128) with round-to-
nearest integers (GPTQ's integers take the same bytes), then write_genai_folder at a context
below max_position_embeddings, so the rotary caches are cut as a real run cuts them.
"""
from __future__ import annotations

import dataclasses

import pytest

from compressor.plan import plan

pytestmark = pytest.mark.slow

CONTEXT = 256            # < the tiny models' 512 positions: the exporter trims cos/sin caches
RECIPES = ("int4", "int8", "fp16")
# tied Llama; Qwen2 (tied, q/k/v biases); Phi-3 (untied: an embedding of its own, fused qkv)
FAMILIES = ("llama", "qwen2", "phi3")


@pytest.fixture(scope="module")
def model_dirs(random_lm_dir, lm_tokenizer, tmp_path_factory):
    """A folder per family; Qwen2's biases made non-zero (random init leaves them 0, and the
    builder drops an all-zero bias, which a real Qwen2 never has)."""
    import torch

    from support import tiny_lm

    qwen2 = tiny_lm.random_lm(lm_tokenizer, "qwen2")
    with torch.no_grad():
        for name, param in qwen2.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, 0.02)
    biased = tiny_lm.save_hf_folder(qwen2, lm_tokenizer,
                                    tmp_path_factory.mktemp("biased") / "tiny-qwen2")
    return {"llama": random_lm_dir("llama"), "qwen2": biased, "phi3": random_lm_dir("phi3")}


def export_onnx(model_dir, recipe: str, root):
    """The ONNX route's export step on `recipe`'s integers; returns the written folder."""
    from compressor.backends.llm.genai import write_genai_folder
    from compressor.backends.llm.handlers import weight_only_plan
    from compressor.backends.llm.load import load_lm
    from compressor.backends.llm.quantize import quantize_lm
    from compressor.context import Context, Data, ModelState
    from compressor.progress import Progress
    from compressor.schemes import Float16, Int4WeightOnly, Int8WeightOnly

    scheme = {"int4": Int4WeightOnly(), "int8": Int8WeightOnly(), "fp16": Float16()}[recipe]
    loaded = load_lm(model_dir)
    grid = weight_only_plan(scheme, loaded)
    if grid is not None:
        grid = dataclasses.replace(grid, algorithm="rtn")
        loaded = loaded.with_quantized(quantize_lm(loaded, grid, None))
    (root / "staging").mkdir(parents=True)
    ctx = Context(data=Data(), progress=Progress(quiet=True), workdir=root / "work",
                  context=CONTEXT)
    return write_genai_folder(ModelState(model=loaded, scheme=scheme), scheme,
                              root / "staging" / "model.onnx", ctx)


@pytest.mark.parametrize("family", FAMILIES)
def test_planned_weights_bytes_match_the_written_folder(family, model_dirs, tmp_path):
    pytest.importorskip("onnxruntime_genai")
    folder = model_dirs[family]
    planned = {p["recipe"]: p["weights_bytes"] for p in
               plan(str(folder), target="jetson-orin-nx-8gb", context=CONTEXT,
                    recipes=list(RECIPES))["plans"]}
    for recipe in RECIPES:
        onnx = export_onnx(folder, recipe, tmp_path / recipe)
        written = sum(f.stat().st_size for f in onnx.iterdir() if f.name.startswith("model.onnx"))
        print(f"{family} {recipe}: planned {planned[recipe]:,} B, written {written:,} B "
              f"({planned[recipe] / written - 1:+.2%})")
        assert planned[recipe] == pytest.approx(written, rel=0.02), (family, recipe)

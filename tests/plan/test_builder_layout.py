"""The plan's artifact bytes against the files the onnxruntime-genai model builder writes for
tiny models of each family (fp16, int8, int4 at blocks 32 and 128; a GPTQ-format checkpoint;
an int4 embedding), within 2%."""
from __future__ import annotations

import pytest

from compressor.decoders.footprint import Storage, builder_layout, weight_bytes
from compressor.decoders.shapes import from_hf_config
from support import plan_models

pytestmark = pytest.mark.slow      # ~30 builder runs in one process

# Not gemma3: builder 0.18 reads rope_parameters["rope_type"], which transformers 5 nests per
# attention type for Gemma 3 (KeyError when it builds a Gemma3ForCausalLM folder).
FAMILIES = ("llama", "llama_untied", "smol192", "qwen2", "qwen3", "mistral", "phi3", "gemma2")
FULL = ("llama", "llama_untied", "smol192")   # every recipe; the other families fp16 + int4
# (out name, family, builder precision, extra options, the layout the plan predicts with)
CASES = [(f"{n}-{p}-{b}", n, p, [f"block_size={b}"], builder_layout(p, p, b))
         for n in FAMILIES for p, b in (("fp16", 32), ("int4", 32)) + (
             (("int8", 32), ("int4", 128)) if n in FULL else ())]
CASES += [("llama_untied-gather", "llama_untied", "int4",
           ["block_size=32", "op_types_to_quantize=MatMul/Gather"],
           builder_layout("x", "int4", 32, quantize_embedding=True)),
          ("llama-int8-lm-head", "llama", "int4",          # tied: the embedding gathers int8 rows
           ["block_size=32", "matmul_mixed_precision=last_matmul:int8"],
           builder_layout("x", "int4", 32, lm_head=Storage(8, 32))),
          ("llama_untied-int8-lm-head", "llama_untied", "int4",
           ["block_size=32", "matmul_mixed_precision=last_matmul:int8"],
           builder_layout("x", "int4", 32, lm_head=Storage(8, 32))),
          ("llama_untied-gptq", "llama_untied-gptq", "int4",
           ["block_size=32", "op_types_to_quantize=MatMul/Gather"],
           builder_layout("x", "int4", 32, prequantized_zero_points=True,
                          quantize_embedding=True))]
# exporter_layout (what compressor's own exporter writes) is held to its files in
# tests/llm/test_plan_matches_exports.py.


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    pytest.importorskip("onnxruntime_genai")
    root = tmp_path_factory.mktemp("builder")
    for name in FAMILIES:
        plan_models.save_hf_folder(name, root / f"hf-{name}")
    plan_models.save_gptq_folder(root / "hf-llama_untied", root / "hf-llama_untied-gptq")
    plan_models.run_builds([(root / f"hf-{family}", root / out, precision, extra)
                            for out, family, precision, extra, _ in CASES])
    return root


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_predicted_artifact_bytes_match_the_builder(built, case):
    out, family, _, _, layout = case
    shape = from_hf_config(plan_models.TINY_CONFIGS[family.removesuffix("-gptq")])
    predicted = weight_bytes(shape, layout).total
    written = plan_models.artifact_bytes(built / out)
    print(f"{out}: predicted {predicted:,} B, builder wrote {written:,} B "
          f"({predicted / written - 1:+.2%})")
    assert abs(predicted / written - 1) < 0.02

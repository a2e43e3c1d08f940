"""The built-in artifact formats, in the house order: TFLite (LiteRT), then ONNX (onnxruntime;
a language model's ONNX artifact is an onnxruntime-genai folder), then GGUF (llama.cpp;
language models only, written when a recipe or --format names it)."""
from __future__ import annotations

from compressor.formats.registry import Format, register_format

register_format(Format(
    name="tflite", runtime="litert", packages=("ai-edge-litert", "tflite-runtime"),
    default_export=True,
    open="compressor.runtimes.tflite:TFLiteRuntime",
    inspect="compressor.runtimes:inspect_tflite_file",   # LiteRT shows INT4 as int8
    open_lm="compressor.runtimes.litert_lm:LiteRtLm",    # prefill / decode signatures
    lm_hint="an LM .tflite with prefill and decode signatures",
    # symmetric integers only (int8 per row, int4 per block): any other grid is rounded again
    lm_weights="compressor.backends.llm.litert_grid:as_computed",
    # ... and its int8 / int4 FULLY_CONNECTEDs quantize their float input per token at run time
    lm_activations="compressor.backends.llm.dynamic_int8:int8_inputs",
    # int8 also means int8 activations: read from the ops, not only the weights
    float_kernels="compressor.export.int8:tflite_float_kernels"))

register_format(Format(
    name="onnx", runtime="onnxruntime", packages=("onnxruntime",), default_export=True,
    open="compressor.runtimes.onnx:OnnxRuntime", options=("optimization",),
    inspect="compressor.runtimes.onnx:inspect_onnx",
    check="compressor.runtimes.onnx_external:check_external_data",
    folder="genai_config.json", folder_hint="a model-onnx/ folder",
    inspect_folder="compressor.runtimes.genai_inspect:inspect_genai",
    open_lm="compressor.runtimes.genai:GenaiLm",
    lm_hint="the model-onnx folder (genai_config.json, model.onnx, tokenizer files)"))

register_format(Format(
    name="gguf", runtime="llama.cpp", packages=("xllamacpp",), model_input=True,
    open="compressor.runtimes.llamacpp:refuse_array",
    inspect="compressor.runtimes.gguf_inspect:inspect_gguf",
    open_lm="compressor.runtimes.llamacpp:LlamaCppLm",
    lm_hint="a .gguf language model",
    # Q4_0 / Q8_0 hold symmetric integers per block of 32 (float16 scales): others rounded again
    lm_weights="compressor.backends.llm.gguf_pack:as_computed",
    lm_int8_block=32))   # Q8_0

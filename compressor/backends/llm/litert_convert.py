"""Trace a Hugging Face causal LM into a float .tflite with prefill and decode signatures and a
KV cache, with litert-torch's `export_hf` route (the transformers model itself, its attention
swapped for LiteRT's cache-aware one): one converter for every family transformers runs.

Run as a child process (`python -m compressor.backends.llm.litert_convert HF_DIR OUT
--prefill 512 --context 4096`) so the converter's memory, its patches of torch / transformers
and its native output stay out of the compress process. It prints one JSON line at the end
(seconds, peak RSS); exit code 3 = the family or its config cannot be converted (the last
stderr line says why).

Signatures: `prefill_<T>` per prefill length (tokens [1, T], input_pos [T], mask
[1, 1, T, context], kv_cache_k_<i> [1, kv_heads, context, head_dim], kv_cache_v_<i>
[1, kv_heads, head_dim, context] -> the updated caches and logits [1, T, vocab] for EVERY
position, which teacher-forced perplexity reads), and `decode` (the same with T = 1).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from compressor.core.memory import own_peak_rss_bytes

UNSUPPORTED = 3   # exit code: the family / config is not one this route converts


def _prefill_with_all_logits():
    """litert-torch's prefill module, but returning logits for all positions (theirs keeps
    only the last one, or none, since LiteRT-LM samples from decode)."""
    import torch
    from litert_torch.generative.export_hf.core import exportable_module as em

    class PrefillWithLogits(em.LiteRTExportableModuleForDecoderOnlyLMPrefill):
        def forward(self, tokens, input_pos, kv_cache, mask, local_mask=None, **kwargs):
            kwargs.update(self.composite_flags())
            inputs = self.adapt_inputs(
                tokens, None, input_pos, kv_cache, mask, local_mask=local_mask,
                use_bool_mask=self.export_config.extra_kwargs.get("use_bool_mask", False),
                **kwargs)
            inputs |= self.attention_kwargs()
            inputs["prefill_logits"] = True
            output = self.model(**inputs)
            return {"kv_cache": output.past_key_values,
                    "logits": output.logits.to(torch.float32)}

    return PrefillWithLogits, em.LiteRTExportableModuleForDecoderOnlyLMPrefill


def _load(folder: str, export_config):
    """The float32 model as litert-torch's own loader prepares it (model patches, static
    cache), without needing the tokenizer files it would also read; with our own patches
    (litert_patches.py: KV heads of multi-head-only families, experts one linear each)."""
    import torch
    import transformers
    from litert_torch.generative.export_hf.core import export_lib
    from litert_torch.generative.export_hf.model_ext import patches

    from compressor.backends.llm import litert_patches

    config = transformers.AutoConfig.from_pretrained(folder, dtype=torch.float32)
    litert_patches.one_kv_head_per_query_head(config)
    with patches.get_patch_context(config.model_type):
        model = transformers.AutoModelForCausalLM.from_pretrained(
            folder, config=config, dtype=torch.float32)
    model = model.to(torch.float32).eval()
    model.generation_config.cache_implementation = "static"
    model.generation_config.do_sample = False
    text_config = getattr(config, "text_config", config)
    export_lib.verify_model_compatibility(model, config, text_config)
    litert_patches.experts_unstacked(model)
    return export_lib.SourceModelArtifacts(model=model, model_config=config,
                                           text_model_config=text_config, tokenizer=None)


def convert(folder: str, out: str, prefill_lengths: list[int], context: int) -> None:
    from litert_torch._convert import interface as converter_lib
    from litert_torch.generative.export_hf.core import export_lib
    from litert_torch.generative.export_hf.core import exportable_module_config as emc
    from litert_torch.generative.export_hf.core.mu import mu_pass_lib
    from litert_torch.generative.export_hf.model_ext import patches

    export_config = emc.ExportableModuleConfig(
        model=folder, output_dir=os.path.dirname(out), work_dir=os.path.dirname(out),
        prefill_lengths=prefill_lengths, cache_length=context, quantization_recipe=None,
        bundle_litert_lm=False, prefill_logits=True)
    source = _load(folder, export_config)
    export_config = export_lib.update_export_config(export_config, source)
    prefill_cls, generic_prefill = _prefill_with_all_logits()
    chosen, decode_cls = export_lib.get_prefill_decode_exportable_cls(
        source.model_config, export_config)
    if chosen is not generic_prefill:
        raise NotImplementedError(f"{source.model_config.model_type} needs litert-torch's "
                                  "model-specific exportables (external embedder)")
    model = source.model
    with patches.patch_model(model, source.text_model_config.model_type, export_config):
        model.set_attn_implementation("lrt_transposed_attention")
        converter = converter_lib.Converter()
        for module in (prefill_cls(model, export_config, source),
                       decode_cls(model, export_config, source)):
            for name, (inputs, _) in module.get_sample_inputs(source.text_model_config).items():
                converter.add_signature(name, module.eval(), sample_kwargs=inputs)
        with export_lib.patch_builtin_tuple_for_export():
            converted = converter.convert(strict_export=False)
    mu_pass_lib.update_model(converted).export(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("out")
    parser.add_argument("--prefill", required=True, help="prefill lengths, comma-separated")
    parser.add_argument("--context", type=int, required=True)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    try:
        convert(args.folder, args.out, [int(n) for n in args.prefill.split(",")], args.context)
    except (NotImplementedError, ValueError, KeyError, AttributeError, TypeError) as exc:
        print(f"litert-torch cannot convert this model: {type(exc).__name__}: "
              f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}", file=sys.stderr)
        return UNSUPPORTED
    print(json.dumps({"seconds": round(time.perf_counter() - start, 2),
                      "peak_rss_bytes": own_peak_rss_bytes()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

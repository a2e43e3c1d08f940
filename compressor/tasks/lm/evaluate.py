"""A language-model artifact measured in its runtime: perplexity on the held-out windows from
the artifact's own logits, next-token and greedy agreement with the original model, and what
generating costs (prefill, decode tokens/s, peak RSS, KV-cache bytes at the configured context).
"""
from __future__ import annotations

from typing import Any

import numpy as np

import compressor.tasks.lm.metrics as lm_metrics
from compressor.config.steps import ValidateConfig

PROMPTS = 4              # greedy generation from the first tokens of this many held-out windows
PROMPT_TOKENS = 32
GREEDY_TOKENS = 32
PREFILL_TOKENS = 512     # the prefill the report times (capped by the artifact's context)
DECODE_TOKENS = 64


def greedy_prompts(windows: np.ndarray) -> list[list[int]]:
    """The fixed prompts greedy agreement is measured on (torch and every artifact alike)."""
    return [row[:PROMPT_TOKENS].tolist() for row in windows[:PROMPTS]]


def evaluate_lm_artifact(path, data, reference: dict[str, np.ndarray], baseline: float,
                         config: ValidateConfig, latency: bool = True, threads: int | None = None,
                         weight_bits: int = 4) -> dict[str, Any]:
    from compressor.runtimes.weights import largest_tensors
    from compressor.runtimes import inspect_artifact
    from compressor.runtimes.lm import open_lm_runtime
    from compressor.runtimes.weights import int8_weight_share, weight_share_at

    info = inspect_artifact(path)
    runtime = open_lm_runtime(path, threads=threads)
    windows = data.val[0]
    outputs = runtime.predict(windows)
    value = lm_metrics.perplexity(outputs)
    generated = [runtime.generate(prompt, GREEDY_TOKENS) for prompt in greedy_prompts(windows)]
    speed = runtime.speed(PREFILL_TOKENS, DECODE_TOKENS) if latency else {}
    share, largest_float = weight_share_at(info.weights, weight_bits)
    int8_share = share if weight_bits == 8 else int8_weight_share(info.weights)[0]
    if weight_bits < 8:   # an int4 recipe keeps its costliest matrices at int8 (llm/mixed.py)
        share += int8_share
    kv_bytes = runtime.kv_cache_bytes
    return {
        "format": info.format, "path": info.path.name, "runtime": runtime.name,
        "size_bytes": info.size_bytes, "gzip_bytes": info.gzip_bytes, "sha256": info.sha256,
        "metric_value": value, "drop": lm_metrics.increase(baseline, value),
        "perplexity": value, "perplexity_increase": lm_metrics.increase(baseline, value),
        "top1_agreement": lm_metrics.top1_agreement(outputs, reference),
        "greedy_agreement": lm_metrics.greedy_agreement(generated,
                                                        reference[lm_metrics.GREEDY].tolist()),
        "prefill_ms": speed.get("prefill_ms"), "prefill_tokens": speed.get("prefill_tokens"),
        "decode_tokens_per_s": speed.get("decode_tokens_per_s"),
        "peak_rss_bytes": speed.get("peak_rss_bytes"),
        "threads": speed.get("threads", runtime.threads), "latency_threads": None,
        "latency_ms_p50": None, "latency_ms_p90": None,
        "kv_cache_bytes": kv_bytes, "context": runtime.context,
        "sparsity": info.sparsity, "weight_dtypes": info.weight_dtypes, "params": info.params,
        "macs": info.macs,
        "weight_bits": weight_bits, "weight_share_at_bits": round(share, 6),
        "int8_weight_share": round(int8_share, 6),
        "largest_float_weights": largest_float,
        # what a device needs to generate at the configured context: measured where the
        # speed run measured it, else the file's weights and the KV cache
        "est_peak_memory_bytes": speed.get("peak_rss_bytes") or info.size_bytes + kv_bytes,
        "runtime_warning": None,
        "largest_tensors": largest_tensors(info.weights),   # report.html's tensor chart
    }

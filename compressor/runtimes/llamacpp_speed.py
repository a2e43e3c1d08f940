"""Time a .gguf in llama.cpp in a process of its own (lm_speed.py says what and why):

    python -m compressor.runtimes.llamacpp_speed MODEL.gguf --threads N --prefill 512 --decode 64

llama.cpp's own timings: the prompt's evaluation (best of lm_speed.PREFILL_REPEATS, the cache
emptied between them) and the decode rate of `decode` greedy tokens (end-of-sequence ignored).
"""
from __future__ import annotations

import sys

import numpy as np

from compressor.core.memory import own_peak_rss_bytes
from compressor.runtimes.lm_speed import PREFILL_REPEATS, child_main, fitting_counts


def measure(path: str, threads: int | None, prefill: int, decode: int) -> dict:
    from compressor.runtimes.llamacpp import LlamaCppLm

    runtime = LlamaCppLm(path, threads=threads)
    prefill, decode = fitting_counts(runtime.context, prefill, decode)
    vocab = int(runtime.vocab_size)
    rng = np.random.default_rng(0)
    best, rate = float("inf"), 0.0
    for _ in range(PREFILL_REPEATS):   # a fresh prompt each time: nothing cached
        ids = rng.integers(min(4, vocab - 1), vocab, prefill).tolist()
        timings = runtime._complete(ids, max_tokens=decode, ignore_eos=True,
                                    cache_prompt=False)["timings"]
        best = min(best, float(timings["prompt_ms"]))
        rate = max(rate, float(timings["predicted_per_second"]))
    return {"prefill_ms": round(best, 3), "decode_tokens_per_s": round(rate, 3),
            "peak_rss_bytes": own_peak_rss_bytes(), "threads": runtime.threads,
            "prefill_tokens": int(prefill), "decode_tokens": int(decode)}


if __name__ == "__main__":
    sys.exit(child_main(measure, __doc__.splitlines()[0]))

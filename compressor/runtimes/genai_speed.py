"""Time an onnxruntime-genai folder in a process of its own, so its peak RSS is what loading
and generating cost (no torch, no compress run around it):

    python -m compressor.runtimes.genai_speed FOLDER --threads N --prefill 512 --decode 64

prints one JSON line: prefill_ms (the best of 3 prefills of `prefill` tokens into a fresh
generator), decode_tokens_per_s (`decode` greedy steps after that prefill, end-of-sequence
suppressed), peak_rss_bytes (VmHWM of this process), threads, prefill_tokens, decode_tokens.
Both counts are capped so prefill + decode fit the artifact's context.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from compressor.runtimes.litert_lm_speed import peak_rss_bytes

PREFILL_REPEATS = 3


def measure(folder: str, threads: int | None, prefill: int, decode: int) -> dict:
    from compressor.runtimes.genai import GenaiLm, _og

    og = _og()
    runtime = GenaiLm(folder, threads=threads)
    context = runtime.context
    prefill = max(1, min(prefill, context - 1, max(context - decode, context // 2)))
    decode = max(1, min(decode, context - prefill))
    vocab = int(runtime.config["model"]["vocab_size"])
    ids = np.random.default_rng(0).integers(min(4, vocab - 1), vocab, prefill).astype(np.int32)
    model = runtime.og_model()

    def generator():
        params = og.GeneratorParams(model)
        total = prefill + decode
        params.set_search_options(max_length=total, min_length=total, do_sample=False)
        return og.Generator(model, params)

    times = []
    for _ in range(PREFILL_REPEATS):
        gen = generator()
        start = time.perf_counter()
        gen.append_tokens(ids)
        times.append(time.perf_counter() - start)
    start = time.perf_counter()
    for _ in range(decode):
        gen.generate_next_token()
    seconds = time.perf_counter() - start
    return {"prefill_ms": round(min(times) * 1000, 3),
            "decode_tokens_per_s": round(decode / seconds, 3),
            "peak_rss_bytes": peak_rss_bytes(),
            "threads": runtime.threads, "prefill_tokens": int(prefill),
            "decode_tokens": int(decode)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--decode", type=int, default=64)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.folder, args.threads, args.prefill, args.decode)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Time an LM .tflite in LiteRT in a process of its own, so its peak RSS is what loading and
generating cost (no torch, no compress run around it):

    python -m compressor.runtimes.litert_lm_speed FILE --threads N --prefill 512 --decode 64

prints one JSON line: prefill_ms (the best of 3 prefills of `prefill` tokens into an empty
cache), decode_tokens_per_s (`decode` greedy steps after that prefill), peak_rss_bytes
(VmHWM of this process), threads, prefill_tokens, decode_tokens. Both counts are capped so
prefill + decode fit the artifact's context.
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time

import numpy as np

PREFILL_REPEATS = 3


def peak_rss_bytes() -> int:
    """This process's peak RSS since it started the program: VmHWM (Linux), which exec
    resets; getrusage's ru_maxrss is kept across exec, so a child forked from a large
    compress process would report that process's size."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure(path: str, threads: int, prefill: int, decode: int) -> dict:
    from compressor.runtimes.litert_lm import LiteRtLm

    runtime = LiteRtLm(path, threads=threads)
    context = runtime.context
    prefill = max(1, min(prefill, context - 1, max(context - decode, context // 2)))
    decode = max(1, min(decode, context - prefill))
    ids = np.random.default_rng(0).integers(1, runtime.vocab_size, prefill)
    times = []
    for _ in range(PREFILL_REPEATS):
        runtime.start()
        start = time.perf_counter()
        logits = runtime.feed(ids, all_logits=False)
        times.append(time.perf_counter() - start)
    start = time.perf_counter()
    for _ in range(decode):
        logits = runtime.feed([int(np.argmax(logits[-1]))], all_logits=False)
    seconds = time.perf_counter() - start
    return {"prefill_ms": round(min(times) * 1000, 3),
            "decode_tokens_per_s": round(decode / seconds, 3),
            "peak_rss_bytes": peak_rss_bytes(),
            "threads": runtime.threads, "prefill_tokens": int(prefill),
            "decode_tokens": int(decode)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--decode", type=int, default=64)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.path, args.threads, args.prefill, args.decode)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Time an LM .tflite in LiteRT in a process of its own (lm_speed.py says what and why):

    python -m compressor.runtimes.litert_lm_speed FILE --threads N --prefill 512 --decode 64

Each decode step feeds back the greedy token of the last logits.
"""
from __future__ import annotations

import sys

import numpy as np

from compressor.runtimes.lm_speed import child_main, fitting_counts, timed


def measure(path: str, threads: int | None, prefill: int, decode: int) -> dict:
    from compressor.runtimes.litert_lm import LiteRtLm

    runtime = LiteRtLm(path, threads=threads)
    prefill, decode = fitting_counts(runtime.context, prefill, decode)
    ids = np.random.default_rng(0).integers(1, runtime.vocab_size, prefill)
    last = {}

    def prefill_once() -> None:
        last["logits"] = runtime.feed(ids, all_logits=False)

    def decode_step() -> None:
        last["logits"] = runtime.feed([int(np.argmax(last["logits"][-1]))], all_logits=False)

    return timed(runtime.start, prefill_once, decode_step, decode, runtime.threads, prefill)


if __name__ == "__main__":
    sys.exit(child_main(measure, __doc__.splitlines()[0]))

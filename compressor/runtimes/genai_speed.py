"""Time an onnxruntime-genai folder in a process of its own (lm_speed.py says what and why):

    python -m compressor.runtimes.genai_speed FOLDER --threads N --prefill 512 --decode 64

End-of-sequence is suppressed (min_length), so every decode step produces a token.
"""
from __future__ import annotations

import sys

import numpy as np

from compressor.runtimes.lm_speed import child_main, fitting_counts, timed


def measure(folder: str, threads: int | None, prefill: int, decode: int) -> dict:
    from compressor.runtimes.genai import GenaiLm, _og

    og = _og()
    runtime = GenaiLm(folder, threads=threads)
    prefill, decode = fitting_counts(runtime.context, prefill, decode)
    vocab = int(runtime.config["model"]["vocab_size"])
    ids = np.random.default_rng(0).integers(min(4, vocab - 1), vocab, prefill).astype(np.int32)
    model = runtime.og_model()
    current = {}

    def reset() -> None:
        params = og.GeneratorParams(model)
        total = prefill + decode
        params.set_search_options(max_length=total, min_length=total, do_sample=False)
        current["generator"] = og.Generator(model, params)

    return timed(reset, lambda: current["generator"].append_tokens(ids),
                 lambda: current["generator"].generate_next_token(), decode, runtime.threads,
                 prefill)


if __name__ == "__main__":
    sys.exit(child_main(measure, __doc__.splitlines()[0]))

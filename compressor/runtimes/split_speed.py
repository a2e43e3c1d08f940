"""Time a split model (runtimes/split_lm.py) in a process of its own, which is rank 0 and starts
the other stages on this machine (lm_speed.py says what is measured):

    python -m compressor.runtimes.split_speed SPLIT_DIR --threads N --prefill 512 --decode 64

Besides lm_speed's keys: `stages`, per stage its peak RSS, RSS once loaded and the activation
bytes it sent per token. Given the unsplit model-onnx folder instead, the same loop times its
model.onnx in this one process (the single-process figure beside it).
"""
from __future__ import annotations

import sys

import numpy as np

from compressor.runtimes.lm_speed import child_main, fitting_counts, timed


def measure(folder: str, threads: int | None, prefill: int, decode: int) -> dict:
    from pathlib import Path

    if not (Path(folder) / "split.json").is_file():
        return measure_whole(folder, threads, prefill, decode)
    return measure_split(folder, threads, prefill, decode)


def measure_whole(folder: str, threads: int | None, prefill: int, decode: int) -> dict:
    """The unsplit model.onnx with the stages' own feeding code (StageModel), one process."""
    import json
    from pathlib import Path

    from compressor.runtimes.common import default_threads
    from compressor.runtimes.split_stages import StageModel

    config = json.loads((Path(folder) / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    threads = default_threads(threads)
    model = StageModel(Path(folder) / decoder.get("filename", "model.onnx"), decoder, threads)
    context = int(config["search"].get("max_length") or config["model"]["context_length"])
    prefill, decode = fitting_counts(context, prefill, decode)
    vocab = int(config["model"]["vocab_size"])
    ids = np.random.default_rng(0).integers(min(4, vocab - 1), vocab, (1, prefill)).astype(np.int64)
    state = {"total": prefill}

    def reset() -> None:
        state["total"] = prefill

    def step() -> None:
        state["total"] += 1
        model.run(1, state["total"], {}, np.array([[5]], np.int64))["logits"].argmax(-1)

    return timed(reset, lambda: model.run(1, prefill, {}, ids)["logits"].argmax(-1), step, decode,
                 threads, prefill)


def measure_split(folder: str, threads: int | None, prefill: int, decode: int) -> dict:
    from compressor.runtimes.split_lm import SplitLm
    from compressor.runtimes.split_stages import WANT_TOKEN

    with SplitLm(folder, threads=threads) as runtime:
        prefill, decode = fitting_counts(runtime.context, prefill, decode)
        ids = np.random.default_rng(0).integers(min(4, runtime.vocab - 1), runtime.vocab,
                                                (1, prefill)).astype(np.int64)
        state = {"total": prefill}

        def reset() -> None:
            state["total"] = prefill

        def step() -> None:
            state["total"] += 1
            runtime._call(np.array([[5]], np.int64), state["total"], WANT_TOKEN)

        result = timed(reset, lambda: runtime._call(ids, prefill, WANT_TOKEN), step, decode,
                       runtime.threads, prefill)
        stages = runtime.stats()
    for stage in stages:
        tokens = stage.pop("sent_tokens")
        stage["sent_bytes_per_token"] = round(stage.pop("sent_bytes") / tokens) if tokens else 0
    result["stages"] = stages
    result["peak_rss_bytes"] = max(s["peak_rss_bytes"] for s in stages)
    return result


if __name__ == "__main__":
    sys.exit(child_main(measure, __doc__.splitlines()[0]))

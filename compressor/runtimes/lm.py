"""Language-model artifacts in their runtimes: `open_lm_runtime(path)` for an onnxruntime-genai
folder (runtimes/genai.py) or an LM .tflite with prefill / decode signatures
(runtimes/litert_lm.py). Every LM runtime has the LmRuntime interface below, so validation,
the report and `compress generate` never ask which format they hold.
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from compressor.errors import ModelLoadError


class LmRuntime(Protocol):
    name: str             # "onnxruntime-genai" | "litert"
    threads: int          # threads actually used
    context: int          # the KV-cache length the artifact is configured for
    kv_cache_bytes: int   # layers x 2 x kv_heads x head_dim x context x dtype bytes

    def predict(self, windows: np.ndarray) -> dict[str, np.ndarray]:
        """Teacher-forced on int64 windows [N, T]: {"next_token": int64 [N, T] (argmax of the
        logits at each position), "token_logprob": float64 [N, T-1] (log-softmax probability
        of windows[:, 1:] given the prefix)}, from the artifact's own logits."""

    def generate(self, prompt_ids: list[int], max_new_tokens: int, on_token=None,
                 stop_ids: tuple[int, ...] = ()) -> list[int]:
        """Greedy with the artifact's KV cache; `on_token(id)` per new token (streaming);
        stops early at a `stop_ids` token or when the context is full."""

    def speed(self, prefill_tokens: int = 512, decode_tokens: int = 64) -> dict:
        """{"prefill_ms", "decode_tokens_per_s", "peak_rss_bytes", "threads", "prefill_tokens",
        "decode_tokens"} measured in a child process that imports only the runtime."""


def open_lm_runtime(path: Path, threads: int | None = None) -> LmRuntime:
    """The LM runtime of `path`; ModelLoadError for anything that is not an LM artifact."""
    path = Path(path)
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file or folder")
    from compressor.runtimes.genai import is_genai_folder

    if is_genai_folder(path):
        from compressor.runtimes.genai import GenaiLm

        return GenaiLm(path, threads=threads)
    if path.is_file() and path.suffix == ".tflite":   # the LiteRT route (runtimes/litert_lm.py)
        from compressor.runtimes.litert_lm import LiteRtLm

        return LiteRtLm(path, threads=threads)
    raise ModelLoadError(f"{path}: not a language-model artifact; expected the model-onnx folder "
                         "(genai_config.json, model.onnx, tokenizer files) or an LM .tflite "
                         "with prefill and decode signatures")

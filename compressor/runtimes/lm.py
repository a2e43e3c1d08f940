"""Language-model artifacts in their runtimes: `open_lm_runtime(path)` for an onnxruntime-genai
folder (runtimes/genai.py) or an LM .tflite with prefill / decode signatures
(runtimes/litert_lm.py), as each format's registry entry names them (compressor/formats).
Every LM runtime has the LmRuntime interface below, so validation, the report and
`compress generate` never ask which format they hold.
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from compressor.errors import ModelLoadError
from compressor.formats import Format, registered_formats, resolve


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
    """The LM runtime of `path`; ModelLoadError for anything that is not an LM artifact.
    Which runtime that is, is the format's registry entry (compressor/formats): a format with
    a folder artifact opens that folder, any other its file."""
    path = Path(path)
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file or folder")
    fmt = lm_format(path)
    if fmt is not None:
        return resolve(fmt.open_lm)(path, threads=threads)
    # folder artifacts first: that is the order they are looked for in
    hints = [f.lm_hint for f in sorted(registered_formats(), key=lambda f: not f.folder)
             if f.open_lm]
    raise ModelLoadError(f"{path}: not a language-model artifact; expected {' or '.join(hints)}")


def lm_format(path: Path) -> Format | None:
    """The format whose language-model artifact `path` is, if any."""
    lm = [f for f in registered_formats() if f.open_lm]
    folder = next((f for f in lm if f.is_folder_artifact(path)), None)
    if folder is not None or not path.is_file():
        return folder
    return next((f for f in lm if not f.folder and path.suffix == f.suffix), None)


PREDICT_BATCH = 4   # windows per call of a whole-window runtime: [4, T, vocab] float32 logits


def teacher_forced(windows: np.ndarray, context: int, logits_of) -> dict[str, np.ndarray]:
    """LmRuntime.predict for a runtime that computes whole windows at once: `logits_of(rows)`
    gives float logits [n, T, vocab] for int64 rows [n, T] (n <= PREDICT_BATCH)."""
    from compressor.errors import DataError

    windows = np.asarray(windows, dtype=np.int64)
    if windows.ndim != 2 or windows.shape[1] < 2:
        raise DataError(f"predict takes token windows [N, T >= 2], got shape {windows.shape}")
    if windows.shape[1] > context:
        raise DataError(f"windows of {windows.shape[1]} tokens do not fit the artifact's "
                        f"context of {context}; use shorter windows")
    next_tokens, logprobs = [], []
    for start in range(0, len(windows), PREDICT_BATCH):
        rows = windows[start:start + PREDICT_BATCH]
        logits = np.asarray(logits_of(rows)).astype(np.float64)
        shifted = logits - logits.max(axis=-1, keepdims=True)
        logp = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
        next_tokens.append(logits.argmax(-1))
        logprobs.append(np.take_along_axis(logp[:, :-1], rows[:, 1:, None], -1)[..., 0])
    return {"next_token": np.concatenate(next_tokens).astype(np.int64),
            "token_logprob": np.concatenate(logprobs).astype(np.float64)}

"""A decoder LM .tflite (prefill_<T> and decode signatures, KV cache as signature inputs and
outputs, litert-torch's export_hf layout) run in LiteRT: teacher-forced logits, greedy
generation with the KV cache, and speed measured in a child process.

Each call takes the cache tensors (kv_cache_k_<i> [1, kv_heads, context, head_dim],
kv_cache_v_<i> [1, kv_heads, head_dim, context]) and returns them updated; this module threads
them from call to call. The graph writes a call's T positions at input_pos[0] with one
contiguous slice, so every call keeps input_pos[0] + T <= context; prompt tails that do not
fit a prefill there go through decode steps. Padding after the real tokens writes cache rows
past the current position, which the causal mask hides until decode overwrites them.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from compressor.errors import DataError, ModelLoadError
from compressor.core.quiet import muted_native_output as muted_output
from compressor.runtimes.common import default_threads

NAME = "litert"
PREFILL = "prefill_"
DECODE = "decode"
KV_PREFIX = "kv_cache_"
MASKED = np.finfo(np.float32).min       # what the causal mask adds to hidden positions
METADATA_PREFIX = "compressor."         # tokenizer files the TFLite route stores in the file
LM_FACTS = "compressor.lm.json"


class _Signature:
    """One signature's subgraph, allocated once, its tensors reached through zero-copy views
    (the public SignatureRunner re-allocates and copies every input and output on each call:
    at a 2048-token context that is ~100 MB of cache per decode step for a 135M model)."""

    def __init__(self, interpreter, name: str):
        runner = interpreter.get_signature_runner(name)
        self._wrapper, self._graph = runner._interpreter_wrapper, runner._subgraph_index
        self.inputs, self.outputs = dict(runner._inputs), dict(runner._outputs)
        self.input_details = runner.get_input_details()
        self.output_details = runner.get_output_details()
        self._wrapper.AllocateTensors(self._graph)

    def input(self, name: str) -> np.ndarray:
        return self._wrapper.tensor(self._wrapper, self.inputs[name], self._graph)

    def output(self, name: str) -> np.ndarray:
        return self._wrapper.tensor(self._wrapper, self.outputs[name], self._graph)

    def invoke(self) -> None:
        self._wrapper.Invoke(self._graph)


class LiteRtLm:
    """The LM runtime of an LLM .tflite (see compressor/runtimes/lm.py for the contract).

    One sequence at a time: `start()` empties the cache, `feed(ids)` appends tokens and
    returns their logits. The cache lives in the output tensors of the signature that ran
    last and is copied into the inputs of the next one (one copy per call)."""

    name = NAME

    def __init__(self, path: Path, threads: int | None = None):
        from compressor.runtimes.tflite import _open

        self.path = Path(path)
        self.threads = default_threads(threads)
        with muted_output():          # the XNNPACK delegate announces itself
            self._interpreter, self.version = _open(self.path, self.threads)
        names = self._interpreter.get_signature_list()
        lengths = sorted(int(n[len(PREFILL):]) for n in names
                         if n.startswith(PREFILL) and n[len(PREFILL):].isdigit())
        if DECODE not in names or not lengths:
            raise ModelLoadError(f"{self.path}: not a language-model .tflite (it needs prefill_<T> "
                                 f"and decode signatures, it has {sorted(names)})")
        self.prefill_lengths = lengths
        self._signatures: dict[str, _Signature] = {}
        decode = self._signature(DECODE)
        self._kv = [n for n in decode.inputs if n.startswith(KV_PREFIX)]
        self.context = int(decode.input_details["mask"]["shape"][-1])
        self.vocab_size = int(decode.output_details["logits"]["shape"][-1])
        self.kv_cache_bytes = int(sum(np.prod(d["shape"]) * np.dtype(d["dtype"]).itemsize
                                      for n, d in decode.input_details.items() if n in self._kv))
        self.start()

    def _signature(self, name: str) -> _Signature:
        if name not in self._signatures:
            with muted_output():
                self._signatures[name] = _Signature(self._interpreter, name)
        return self._signatures[name]

    def start(self) -> None:
        """A new sequence: an empty cache, position 0."""
        self._holder: _Signature | None = None     # whose outputs hold the cache
        self.position = 0

    def _call(self, name: str, tokens: np.ndarray) -> np.ndarray:
        """Run `tokens` (exactly the signature's length) at self.position onwards; returns a
        view of the logits [T, vocab] (valid until the next call)."""
        signature = self._signature(name)
        for kv in self._kv:
            if self._holder is None:
                signature.input(kv).fill(0)
            else:
                np.copyto(signature.input(kv), self._holder.output(kv))
        positions = np.arange(self.position, self.position + len(tokens), dtype=np.int32)
        mask = np.where(np.arange(self.context)[None, :] <= positions[:, None], 0.0, MASKED)
        np.copyto(signature.input("tokens"), tokens.astype(np.int32)[None])
        np.copyto(signature.input("input_pos"), positions)
        np.copyto(signature.input("mask"), mask[None, None].astype(np.float32))
        signature.invoke()
        self._holder = signature
        return signature.output("logits")[0]

    def feed(self, ids, all_logits: bool = True) -> np.ndarray:
        """Append `ids` to the sequence, prefill chunks where they fit, decode steps for the
        rest; returns their logits [len(ids), vocab] (only the last row if not all_logits)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if self.position + len(ids) > self.context:
            raise DataError(f"{len(ids)} tokens at position {self.position} do not fit the "
                            f"artifact's context of {self.context} tokens; use shorter prompts "
                            "or windows")
        rows, done = [], 0              # all_logits=False: only the last chunk's last row
        while done < len(ids):
            left = len(ids) - done
            fits = [t for t in self.prefill_lengths if self.position + t <= self.context]
            if left > 1 and fits:
                length = next((t for t in fits if t >= left), fits[-1])
                n = min(length, left)
                chunk = np.zeros(length, np.int64)
                chunk[:n] = ids[done:done + n]
                logits = self._call(f"{PREFILL}{length}", chunk)[:n]
            else:
                n = 1
                logits = self._call(DECODE, ids[done:done + 1])
            rows.append(np.array(logits if all_logits else logits[-1:]))
            self.position += n
            done += n
        return np.concatenate(rows) if all_logits else rows[-1]

    def predict(self, windows: np.ndarray) -> dict[str, np.ndarray]:
        """Teacher-forced: next_token int64 [N, T] (argmax at each position), token_logprob
        float64 [N, T-1] (log-softmax probability of windows[:, 1:])."""
        windows = np.asarray(windows, dtype=np.int64)
        if windows.ndim != 2:
            raise DataError(f"predict takes token windows [N, T], got shape {windows.shape}")
        next_tokens, logprobs = [], []
        for row in windows:
            self.start()
            logits = self.feed(row).astype(np.float64)
            shifted = logits - logits.max(axis=-1, keepdims=True)
            logp = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
            next_tokens.append(logits.argmax(-1))
            logprobs.append(logp[np.arange(len(row) - 1), row[1:]])
        return {"next_token": np.stack(next_tokens).astype(np.int64),
                "token_logprob": np.stack(logprobs).astype(np.float64)}

    def generate(self, prompt_ids: list[int], max_new_tokens: int, on_token=None,
                 stop_ids: tuple[int, ...] = ()) -> list[int]:
        """Greedy: the prompt through prefill, then one decode step per new token (fewer if
        the context fills up or a `stop_ids` token comes)."""
        if not len(prompt_ids):
            raise DataError("generate needs at least one prompt token")
        self.start()
        logits = self.feed(prompt_ids, all_logits=False)
        out = []
        while len(out) < max_new_tokens:
            token = int(np.argmax(logits[-1]))
            out.append(token)
            if on_token is not None:
                on_token(token)
            if token in stop_ids or self.position >= self.context or len(out) == max_new_tokens:
                break
            logits = self.feed([token], all_logits=False)
        return out

    def speed(self, prefill_tokens: int = 512, decode_tokens: int = 64) -> dict:
        """prefill_ms, decode_tokens_per_s, peak_rss_bytes, threads, prefill_tokens: measured
        in a child process that imports only this runtime (no torch)."""
        from compressor.runtimes.lm_speed import run_child

        return run_child("compressor.runtimes.litert_lm_speed", self.path, self.threads, prefill_tokens, decode_tokens,
                         "LiteRT")

    def tokenizer_files(self) -> dict[str, bytes]:
        """The tokenizer files the TFLite route stored in the file ("tokenizer.json", ...),
        and "lm.json" (bos / eos / pad ids, model type); empty for other LM .tflite files."""
        from compressor.runtimes.tflite_file import metadata_entries

        return {name[len(METADATA_PREFIX):]: data
                for name, data in metadata_entries(self.path, METADATA_PREFIX).items()}

"""A .gguf language model run in llama.cpp itself (the `xllamacpp` wheel: llama.cpp's CPU build
and its server engine in-process, no HTTP): teacher-forced log-probabilities, greedy generation
and speed, with the LmRuntime contract (runtimes/lm.py).

Teacher forcing through the server's completion call: the prompt is the window's first i token
ids, one token is generated with that window's token i forced by a logit bias, and
`n_probs` reports the forced token's log-probability from the model's raw logits (the server
takes them before any sampler, bias included) beside the top token (the argmax). The server
keeps the prompt's KV cache between calls, so each position costs one token of compute.
The server withholds a token that ends inside a UTF-8 character (a byte token of a byte-level
BPE: curly quotes, accents), probabilities included; at such a position a plain-text token is
forced instead and the whole distribution asked for (n_probs = the vocabulary, ~0.4 s at 49k
tokens), which holds the forced one's log-probability too.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from compressor.decoders.footprint_gguf import LLAMA_CPP_KV_TYPES
from compressor.decoders.gguf_header import GGUF_CONTEXT_KEY as CONTEXT_KEY
from compressor.decoders.gguf_header import GGUF_TOKENIZER_KEY as FILE_KEY
from compressor.errors import BackendUnavailableError, DataError, ModelLoadError
from compressor.runtimes.common import default_threads

NAME = "llama.cpp"
DEFAULT_CONTEXT = 4096               # a foreign file's KV cache: at most this, as other routes
FORCE = 100.0                        # the logit bias that makes the forced token the sample


def _xllamacpp():
    try:
        import xllamacpp
    except ImportError:
        raise BackendUnavailableError("running a .gguf needs llama.cpp's Python wheel: "
                                      "pip install xllamacpp (make install does)") from None
    return xllamacpp


def read_facts(path: Path) -> dict:
    """The file's architecture facts llama.cpp sizes its KV cache by, and our own keys."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:   # gguf raises ValueError / struct errors on a damaged file
        raise ModelLoadError(f"{path}: not a readable GGUF file ({exc})") from None
    fields = {name: field.contents() for name, field in reader.fields.items()
              if not name.startswith(("tokenizer.ggml.tokens", "tokenizer.ggml.merges",
                                      "tokenizer.ggml.token_type", "tokenizer.ggml.scores"))}
    arch = fields.get("general.architecture", "")
    return {"fields": fields, "architecture": arch,
            "layers": int(fields.get(f"{arch}.block_count", 0)),
            "kv_heads": int(fields.get(f"{arch}.attention.head_count_kv",
                                       fields.get(f"{arch}.attention.head_count", 0))),
            "head_dim": int(fields.get(f"{arch}.attention.key_length", 0) or (
                int(fields.get(f"{arch}.embedding_length", 0))
                // max(int(fields.get(f"{arch}.attention.head_count", 1)), 1))),
            # the context the run validated; a foreign file's: its own, at most DEFAULT_CONTEXT
            "context": int(fields.get(CONTEXT_KEY, 0)) or min(
                int(fields.get(f"{arch}.context_length", DEFAULT_CONTEXT)), DEFAULT_CONTEXT),
            "reader": reader,
            "vocab": len(reader.fields["tokenizer.ggml.tokens"].data)
            if "tokenizer.ggml.tokens" in reader.fields else 0,
            "plain_token": _plain_token(reader)}


def _plain_token(reader) -> int:
    """A token whose text is one plain ASCII letter or digit (the server never withholds it)."""
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        return 0
    for i, part in enumerate(tokens.data):
        text = bytes(tokens.parts[part]).decode("utf-8", "replace")
        if len(text) == 1 and text.isascii() and text.isalnum():
            return i
    return 0


def kv_cache_bytes(facts: dict, context: int, kv_type: str = "f16") -> int:
    """llama.cpp's KV cache for the file (`read_facts`) at `context` tokens: every layer's keys
    and values at the cache type's bytes per element (footprint_gguf, as the plan counts it)."""
    return int(facts["layers"] * 2 * facts["kv_heads"] * facts["head_dim"] * context
               * LLAMA_CPP_KV_TYPES[kv_type])


class LlamaCppLm:
    """The LM runtime of a .gguf (see compressor/runtimes/lm.py for the contract)."""

    name = NAME

    def __init__(self, path: Path, threads: int | None = None, kv_type: str = "f16"):
        self.path = Path(path)
        self.threads = default_threads(threads)
        facts = read_facts(self.path)
        self.tokenizer_text = {name[len(FILE_KEY):]: value.encode("utf-8")
                               for name, value in facts["fields"].items()
                               if name.startswith(FILE_KEY)}
        self.eos_ids = tuple(int(facts["fields"][k]) for k in ("tokenizer.ggml.eos_token_id",)
                             if k in facts["fields"])
        self.vocab_size = facts["vocab"]
        self._plain = facts["plain_token"]
        self.context = facts["context"]
        self.kv_type = kv_type
        self.kv_cache_bytes = kv_cache_bytes(facts, self.context, kv_type)
        self._server = _start(self.path, self.context, self.threads, kv_type)

    def _complete(self, prompt: list[int], **options) -> dict:
        request = {"prompt": [int(t) for t in prompt], "temperature": 0, "cache_prompt": True,
                   **options}
        answer = self._server.handle_completions(request)
        if "error" in answer or "choices" not in answer:
            raise ModelLoadError(f"{self.path.name}: llama.cpp refused a completion "
                                 f"({answer.get('error', answer)})")
        return answer

    def predict(self, windows: np.ndarray) -> dict[str, np.ndarray]:
        windows = np.asarray(windows, dtype=np.int64)
        if windows.ndim != 2:
            raise DataError(f"predict takes token windows [N, T], got shape {windows.shape}")
        if windows.shape[1] > self.context:
            raise DataError(f"windows of {windows.shape[1]} tokens do not fit the artifact's "
                            f"context of {self.context}; use shorter windows")
        tops = np.zeros(windows.shape, np.int64)
        logprobs = np.zeros((windows.shape[0], windows.shape[1] - 1), np.float64)
        for r, row in enumerate(windows):
            for i in range(1, len(row) + 1):
                target = int(row[i]) if i < len(row) else None
                tops[r, i - 1], logprob = self._position(row[:i], target)
                if target is not None:
                    logprobs[r, i - 1] = logprob
        return {"next_token": tops, "token_logprob": logprobs}

    def _position(self, prefix: np.ndarray, target: int | None) -> tuple[int, float]:
        """(the argmax after `prefix`, log p(target | prefix)), see the module docs."""
        entry = self._forced(prefix, self._plain if target is None else target, 1)
        if entry is not None:
            return int(entry["top_logprobs"][0]["id"]), float(entry["logprob"])
        entry = self._forced(prefix, self._plain, self.vocab_size)
        if entry is None:
            raise ModelLoadError(f"{self.path.name}: llama.cpp returned no probabilities")
        ranked = entry["top_logprobs"]
        logprob = next((float(e["logprob"]) for e in ranked if e["id"] == target), -np.inf)
        return int(ranked[0]["id"]), logprob

    def _forced(self, prefix: np.ndarray, token: int, probs: int) -> dict | None:
        answer = self._complete(prefix, max_tokens=1, n_probs=probs, ignore_eos=True,
                                logit_bias=[[int(token), FORCE]])
        content = (answer["choices"][0].get("logprobs") or {}).get("content")
        return content[0] if content else None

    def generate(self, prompt_ids: list[int], max_new_tokens: int, on_token=None,
                 stop_ids: tuple[int, ...] = ()) -> list[int]:
        if not len(prompt_ids):
            raise DataError("generate needs at least one prompt token")
        if len(prompt_ids) >= self.context:
            raise DataError(f"the prompt has {len(prompt_ids)} tokens, but the artifact's context "
                            f"is {self.context}; shorten it")
        out: list[int] = []
        prefix = list(prompt_ids)
        # one greedy step per call (the cache keeps the prefix): a whole completion would drop
        # the tokens the server withholds mid-character, see the module docs
        while len(out) < max_new_tokens and len(prefix) < self.context:
            token, _ = self._position(np.asarray(prefix), None)
            out.append(token)
            prefix.append(token)
            if on_token is not None:
                on_token(token)
            if token in stop_ids:
                break
        return out

    def speed(self, prefill_tokens: int = 512, decode_tokens: int = 64) -> dict:
        from compressor.runtimes.lm_speed import run_child

        return run_child("compressor.runtimes.llamacpp_speed", self.path, self.threads,
                         prefill_tokens, decode_tokens, "llama.cpp")

    def tokenizer_files(self) -> dict[str, bytes]:
        """The tokenizer files the GGUF route stored in the file (see gguf_vocab.py)."""
        return dict(self.tokenizer_text)


def _start(path: Path, context: int, threads: int, kv_type: str):
    """llama.cpp's server engine on the file, quiet, one slot."""
    xllamacpp = _xllamacpp()
    params = xllamacpp.CommonParams()
    params.model.path = str(path)
    # one slot past the context: a window of `context` tokens is scored up to its last
    # position, which asks llama.cpp for one token more (the argmax after the whole window)
    params.n_ctx = int(context) + 1
    params.n_batch = params.n_ubatch = min(512, int(context) + 1)
    params.n_parallel = 1
    # a full-length cache for sliding-window layers too: teacher forcing moves back to earlier
    # positions, which a window-sized cache has already dropped (Gemma 3 with a 16-token
    # window scored its second window 0.15 nats off without it)
    params.swa_full = True
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = int(threads)
    params.cache_type_k = params.cache_type_v = getattr(xllamacpp.ggml_type, f"GGML_TYPE_{kv_type.upper()}")
    params.warmup = False
    params.verbosity = -1
    os.environ.setdefault("LLAMA_LOG_VERBOSITY", "-1")
    try:
        return xllamacpp.Server(params)
    except Exception as exc:   # the wheel raises RuntimeError on a file it cannot load
        raise ModelLoadError(f"{path}: llama.cpp could not load it ({exc})") from None


def refuse_array(path: Path, threads: int | None = None, **_options):
    """A .gguf opened as a classifier / encoder artifact: it only holds language models."""
    raise ModelLoadError(f"{path}: a .gguf holds a language model; run it with "
                         "`compress generate` or validate it with an LM recipe")

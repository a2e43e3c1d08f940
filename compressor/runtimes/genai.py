"""A decoder LM as the folder onnxruntime-genai opens (model.onnx, its data, genai_config.json,
tokenizer files): teacher-forced outputs from model.onnx in an onnxruntime InferenceSession,
greedy generation with onnxruntime-genai's Generator and its KV cache, and speed measured in
a child process (compressor/runtimes/genai_speed.py).

Teacher-forced windows run as one prefill each with empty past_key_values ([B, kv_heads, 0,
head_size]; genai_config.json gives the shapes, the graph's inputs are symbolic), so the
logits are the artifact's own over the whole window.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from compressor.errors import BackendUnavailableError, DataError, ModelLoadError
from compressor.runtimes.common import default_threads

NAME = "onnxruntime-genai"
CONFIG = "genai_config.json"
ORT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


def is_genai_folder(path: Path) -> bool:
    return Path(path).is_dir() and (Path(path) / CONFIG).is_file()


def read_config(folder: Path) -> dict:
    path = Path(folder) / CONFIG
    try:
        config = json.loads(path.read_text())
        config["model"]["decoder"]["num_hidden_layers"]   # noqa: B018  (the keys we read)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"{path}: not an onnxruntime-genai config ({exc}); export the "
                             "model again") from None
    return config


def context_of(config: dict) -> int:
    """The KV-cache length the folder is configured for (search.max_length, which bounds
    prompt + generated tokens; context_length when absent)."""
    return int(config.get("search", {}).get("max_length") or config["model"]["context_length"])


def kv_cache_bytes(folder: Path, config: dict) -> int:
    """layers x 2 (K, V) x kv_heads x head_size x context x the cache's dtype bytes."""
    decoder = config["model"]["decoder"]
    itemsize = 2 if kv_dtype(Path(folder) / decoder.get("filename", "model.onnx")) == "float16" else 4
    return int(decoder["num_hidden_layers"] * 2 * decoder["num_key_value_heads"]
               * decoder["head_size"] * context_of(config) * itemsize)


def kv_dtype(model_path: Path) -> str:
    """The dtype of the past_key_values inputs, read from the graph (no weights loaded)."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    for value in model.graph.input:
        if value.name.startswith("past_key_values"):
            return "float16" if value.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16 else "float32"
    return "float32"


def _og():
    try:
        import onnxruntime_genai
    except ImportError as exc:
        raise BackendUnavailableError("running an onnxruntime-genai folder needs "
                                      f"onnxruntime-genai: pip install onnxruntime-genai ({exc})") from None
    return onnxruntime_genai


class GenaiLm:
    """The LM runtime of a genai folder (the contract: compressor/runtimes/lm.py)."""

    name = NAME

    def __init__(self, folder: Path, threads: int | None = None):
        self.folder = Path(folder)
        if not is_genai_folder(self.folder):
            raise ModelLoadError(f"{self.folder}: no {CONFIG}; an onnxruntime-genai folder holds "
                                 "model.onnx, genai_config.json and tokenizer files")
        self.threads = default_threads(threads)
        self.config = read_config(self.folder)
        decoder = self.config["model"]["decoder"]
        self.model_path = self.folder / decoder.get("filename", "model.onnx")
        self.context = context_of(self.config)
        self.kv_cache_bytes = kv_cache_bytes(self.folder, self.config)
        self.eos_ids = _ids(self.config["model"].get("eos_token_id"))
        self._session = None
        self._model = None

    # --- teacher-forced ------------------------------------------------------------------
    def _open_session(self):
        """The InferenceSession; the generation model is closed first (each holds its own copy
        of the weights: one at a time)."""
        if self._session is None:
            import onnxruntime as ort

            self._close("_model")

            options = ort.SessionOptions()
            options.intra_op_num_threads = self.threads
            options.inter_op_num_threads = 1
            options.log_severity_level = 3
            try:
                self._session = ort.InferenceSession(str(self.model_path), sess_options=options,
                                                     providers=["CPUExecutionProvider"])
            except Exception as exc:   # onnxruntime's pybind errors have no common base
                raise ModelLoadError(f"{self.model_path}: onnxruntime cannot load it "
                                     f"({str(exc).strip()[:200]}); export it again") from None
        return self._session

    def logits(self, windows: np.ndarray) -> np.ndarray:
        """float32 logits [N, T, vocab] of windows [N, T] (each from an empty cache)."""
        session = self._open_session()
        windows = np.asarray(windows, dtype=np.int64)
        batch, length = windows.shape
        decoder = self.config["model"]["decoder"]
        feeds = {}
        for value in session.get_inputs():
            if value.name == "input_ids":
                feeds[value.name] = windows
            elif value.name == "attention_mask":
                feeds[value.name] = np.ones_like(windows)
            elif value.name == "position_ids":
                feeds[value.name] = np.broadcast_to(np.arange(length), windows.shape).copy()
            elif value.name.startswith("past_key_values"):
                feeds[value.name] = np.zeros((batch, decoder["num_key_value_heads"], 0,
                                              decoder["head_size"]), ORT_TYPES.get(value.type, np.float32))
        return session.run(["logits"], feeds)[0].astype(np.float32)

    def predict(self, windows: np.ndarray) -> dict[str, np.ndarray]:
        """next_token int64 [N, T] (argmax at each position), token_logprob float64 [N, T-1]
        (log-softmax probability of windows[:, 1:] given the prefix)."""
        from compressor.runtimes.lm import teacher_forced

        return teacher_forced(windows, self.context, self.logits)

    # --- generation ----------------------------------------------------------------------
    def og_model(self):
        """The onnxruntime_genai Model, with this runtime's thread count overlaid."""
        if self._model is None:
            og = _og()
            self._close("_session")
            config = og.Config(str(self.folder))
            config.overlay(json.dumps({"model": {"decoder": {"session_options": {
                "intra_op_num_threads": self.threads, "inter_op_num_threads": 1}}}}))
            self._model = og.Model(config)
        return self._model

    def generate(self, prompt_ids: list[int], max_new_tokens: int, on_token=None,
                 stop_ids: tuple[int, ...] = ()) -> list[int]:
        """Greedy, with the artifact's KV cache. End-of-sequence tokens are suppressed unless
        they are in `stop_ids` (as torch's reference generates with min_new_tokens); stops
        early when the context is full or a `stop_ids` token comes."""
        og = _og()
        prompt_ids = [int(t) for t in prompt_ids]
        if not prompt_ids:
            raise DataError("generate needs at least one prompt token")
        if len(prompt_ids) >= self.context:
            raise DataError(f"the prompt has {len(prompt_ids)} tokens, but the artifact's context "
                            f"is {self.context}; shorten it")
        total = min(len(prompt_ids) + int(max_new_tokens), self.context)
        params = og.GeneratorParams(self.og_model())
        keep_eos = any(t in stop_ids for t in self.eos_ids)
        params.set_search_options(max_length=total, do_sample=False,
                                  min_length=len(prompt_ids) if keep_eos else total)
        generator = og.Generator(self.og_model(), params)
        generator.append_tokens(prompt_ids)
        out: list[int] = []
        while not generator.is_done() and len(out) < max_new_tokens:
            generator.generate_next_token()
            token = int(generator.get_next_tokens()[0])
            out.append(token)
            if on_token is not None:
                on_token(token)
            if token in stop_ids:
                break
        return out

    def _close(self, attribute: str) -> None:
        if getattr(self, attribute) is not None:
            from compressor.core.memory import trim_heap

            setattr(self, attribute, None)
            trim_heap()

    def speed(self, prefill_tokens: int = 512, decode_tokens: int = 64) -> dict:
        """prefill_ms, decode_tokens_per_s, peak_rss_bytes, threads (+ the token counts used):
        measured in a child process that imports only onnxruntime-genai (no torch)."""
        from compressor.runtimes.lm_speed import run_child

        return run_child("compressor.runtimes.genai_speed", self.folder, self.threads, prefill_tokens, decode_tokens,
                         "onnxruntime-genai")


def _ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in (value if isinstance(value, list) else [value]))

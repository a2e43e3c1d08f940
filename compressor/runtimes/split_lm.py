"""A split model (a folder with split.json, export/onnx_split.py) as an LM runtime (the
contract: runtimes/lm.py): this process is rank 0, runs stage 0 and drives; stages 1..K-1 are
processes of their own (split_stages.py) joined over torch.distributed (gloo).

One-machine mode (`SplitLm(folder)`) starts them here; with `master="HOST:PORT"` rank 0
listens there and waits for `compress stage FOLDER --rank k --master HOST:PORT` on the other
boards. `close()` (also on any failure) stops them; a stage that dies or cannot start is a
StageError naming it.
"""
from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import numpy as np

from compressor.errors import DataError
from compressor.runtimes.common import default_threads
from compressor.runtimes.split_launch import Stages, StageError
from compressor.runtimes.split_stages import (OP_RUN, OP_STATS, OP_STOP, STATS_KEYS, STATS_SPEC,
                                              WANT_LOGITS, WANT_TOKEN, WANT_TOKEN_NO_EOS, Counters, open_stage,
                                              read_split, recv_tensors, send_header, send_tensors)

NAME = "onnxruntime, split (gloo)"
DEFAULT_TIMEOUT_S = 20.0
REMOTE_WAIT_S = 300.0    # boards start their stage by hand: time to do so


class SplitLm:
    name = NAME

    def __init__(self, folder: Path, threads: int | None = None, master: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S):
        import torch.distributed as dist

        self.folder = Path(folder)
        self.split = read_split(self.folder)
        self.world = len(self.split["stages"])
        config = json.loads((self.folder / "genai_config.json").read_text())
        decoder = config["model"]["decoder"]
        self.context = int(config.get("search", {}).get("max_length") or config["model"]["context_length"])
        self.kv_cache_bytes = int(decoder["num_hidden_layers"] * 2 * decoder["num_key_value_heads"]
                                  * decoder["head_size"] * self.context * 4)
        eos = config["model"].get("eos_token_id")
        self.eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos] if eos is not None else []))
        self.vocab = int(config["model"]["vocab_size"])
        local = master is None
        cores = default_threads(None)
        self.threads = default_threads(threads) if threads else max(1, cores // self.world if local else cores)
        host, _, port = (master or "127.0.0.1:0").rpartition(":")
        self.counters = Counters()
        self.stages = None
        self._group = False
        try:
            self.stages = Stages(self.folder, self.world, host or "0.0.0.0", int(port), timeout,
                                 local, self.threads if local else None)
            self.stage = open_stage(self.folder, self.split, 0, self.threads)
            self.counters.rss_loaded = self.counters.peak()
            self.stages.wait_ready(timeout if local else REMOTE_WAIT_S)
            dist.init_process_group("gloo", store=self.stages.store, rank=0, world_size=self.world,
                                    timeout=timedelta(seconds=timeout))
            self._group = True
        except BaseException:
            self.close(stop=False)
            raise

    # --- the pipeline --------------------------------------------------------------------
    def _call(self, ids: np.ndarray, total: int, want: int) -> np.ndarray:
        """One pass of `ids` [B, new] through every stage; the logits or the next token ids."""
        if self.stages is None:
            raise StageError("the split model's stages are closed")
        batch, new = ids.shape
        try:
            out = self.stage.run(batch, total, {}, ids)
            header = [OP_RUN, batch, new, total, want]
            send_header(header, 1)
            arrays = [out[n] for n in self.split["stages"][0]["sends"]]
            self.counters.sent_bytes += send_tensors(arrays, 1)
            self.counters.sent_tokens += batch * new
            result = self.split["result"]["token" if want != WANT_LOGITS else "full"]
            leading = (batch,) if want != WANT_LOGITS else (batch, new)
            return recv_tensors([result], leading, self.world - 1)[result["name"]]
        except RuntimeError as exc:   # gloo: a peer closed its connection or timed out
            error = self.stages.failure(exc)
            self.close(stop=False)
            raise error from None

    def logits(self, windows: np.ndarray) -> np.ndarray:
        windows = np.asarray(windows, dtype=np.int64)
        return self._call(windows, windows.shape[1], WANT_LOGITS)

    def predict(self, windows: np.ndarray) -> dict[str, np.ndarray]:
        from compressor.runtimes.lm import teacher_forced

        return teacher_forced(windows, self.context, self.logits)

    def generate(self, prompt_ids: list[int], max_new_tokens: int, on_token=None,
                 stop_ids: tuple[int, ...] = ()) -> list[int]:
        """Greedy, each stage with its KV cache; end-of-sequence suppressed unless it is in
        `stop_ids` (as GenaiLm.generate)."""
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise DataError("generate needs at least one prompt token")
        if len(prompt) >= self.context:
            raise DataError(f"the prompt has {len(prompt)} tokens, but the artifact's context "
                            f"is {self.context}; shorten it")
        want = WANT_TOKEN if any(t in stop_ids for t in self.eos_ids) else WANT_TOKEN_NO_EOS
        ids, total, out = np.array([prompt], np.int64), len(prompt), []
        for _ in range(min(int(max_new_tokens), self.context - len(prompt))):
            token = int(self._call(ids, total, want)[0])
            out.append(token)
            if on_token is not None:
                on_token(token)
            if token in stop_ids:
                break
            ids, total = np.array([[token]], np.int64), total + 1
        return out

    def stats(self) -> list[dict]:
        """Per stage: peak RSS, RSS once loaded, activation bytes sent and tokens passed on."""
        send_header([OP_STATS, 0, 0, 0, 0], 1)
        rows = [self.counters.as_array()]
        for rank in range(1, self.world):
            rows.append(recv_tensors([STATS_SPEC], (), rank)["stats"])
        return [dict(zip(STATS_KEYS, (int(v) for v in row))) for row in rows]

    def speed(self, prefill_tokens: int = 512, decode_tokens: int = 64) -> dict:
        """Measured in a child process that is rank 0 itself (runtimes/split_speed.py)."""
        from compressor.runtimes.lm_speed import run_child

        return run_child("compressor.runtimes.split_speed", self.folder, self.threads,
                         prefill_tokens, decode_tokens, NAME)

    def pids(self) -> list[int]:
        return self.stages.pids() if self.stages is not None else []

    def close(self, stop: bool = True) -> None:
        import torch.distributed as dist

        if self._group:
            if stop:
                try:
                    send_header([OP_STOP, 0, 0, 0, 0], 1)
                except RuntimeError:
                    pass   # the stages are gone already; close() ends what is left
            dist.destroy_process_group()
            self._group = False
        if self.stages is not None:
            self.stages.close()
            self.stages = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "stages", None) is not None:
            self.close(stop=False)

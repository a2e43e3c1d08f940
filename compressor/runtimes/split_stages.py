"""The stages of a split model (export/onnx_split.py wrote them; split.json describes them) run
as one process per stage over torch.distributed with the gloo backend: point-to-point
`dist.send` / `dist.recv` of tensors along the chain 0 -> 1 -> ... -> K-1, and the result
(the logits, or only the next token's id) from the last stage back to rank 0, which drives
(runtimes/split_lm.py). Each stage is one onnxruntime session over its stage{k}.onnx and keeps
its own layers' KV cache (the presents fed back as the next call's past).

Per call rank 0 sends a header (int64: op, batch, new tokens, total tokens, what to return)
down the chain, then the crossing tensors split.json lists for that link. A stage process:

    python -m compressor.runtimes.split_stages SPLIT_DIR --rank K --master HOST:PORT

joins rank 0's TCPStore (torch's own rendezvous), loads its session, says `ready/K` (or
`error/K` with the reason) in the store, then joins the gloo group and serves until STOP.
"""
from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np

from compressor.errors import ModelLoadError

OP_STOP, OP_RUN, OP_STATS = 0, 1, 2
WANT_LOGITS, WANT_TOKEN, WANT_TOKEN_NO_EOS = 0, 1, 2
STATS_SPEC = {"name": "stats", "dtype": "float64", "shape": [5]}
STATS_KEYS = ("peak_rss_bytes", "rss_imported_bytes", "rss_loaded_bytes", "sent_bytes", "sent_tokens")
HEADER = 5
NUMPY = {"float64": np.float64, "float32": np.float32, "float16": np.float16, "int64": np.int64, "int32": np.int32}
PEER_LOST = 3            # a stage's exit code when its neighbour went away


def read_split(folder: Path) -> dict:
    path = Path(folder) / "split.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{folder}: not a split model folder ({exc}); write one with "
                             "`compress split ARTIFACT --devices K --out DIR`") from None


class StageModel:
    """One stage{k}.onnx (or the whole model.onnx) in an onnxruntime session, with the KV
    cache of its layers: run(header values, received tensors) -> its outputs by name."""

    def __init__(self, path: Path, decoder: dict, threads: int | None = None):
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        try:
            self.session = ort.InferenceSession(str(path), sess_options=options,
                                                providers=["CPUExecutionProvider"])
        except Exception as exc:   # onnxruntime's pybind errors have no common base
            raise ModelLoadError(f"{path}: onnxruntime cannot load it "
                                 f"({str(exc).strip()[:200]})") from None
        self.inputs = {v.name: v for v in self.session.get_inputs()}
        self.outputs = [v.name for v in self.session.get_outputs()]
        self.kv_shape = (decoder["num_key_value_heads"], decoder["head_size"])
        self.past: dict[str, np.ndarray] = {}

    def run(self, batch: int, total: int, received: dict, input_ids=None) -> dict:
        """Feed `received` and the graph inputs this stage reads; a call whose new tokens are
        all its tokens (total == new) starts from an empty cache."""
        new = next(iter(received.values())).shape[1] if received else input_ids.shape[1]
        if total == new:
            self.past = {}
        feeds = {}
        for name, value in self.inputs.items():
            if name in received:
                feeds[name] = received[name]
            elif name == "input_ids":
                feeds[name] = input_ids
            elif name == "attention_mask":
                feeds[name] = np.ones((batch, total), np.int64)
            elif name == "position_ids":
                feeds[name] = np.broadcast_to(np.arange(total - new, total), (batch, new)).copy()
            elif name.startswith("past_key_values"):
                empty = np.zeros((batch, self.kv_shape[0], 0, self.kv_shape[1]),
                                 np.float16 if value.type == "tensor(float16)" else np.float32)
                feeds[name] = self.past.get(name, empty)
            else:
                raise ModelLoadError(f"a stage input this runtime cannot feed: {name}")
        out = dict(zip(self.outputs, self.session.run(self.outputs, feeds)))
        for name in list(out):
            if name.startswith("present."):
                self.past["past_key_values." + name[len("present."):]] = out.pop(name)
        return out


def open_stage(folder: Path, split: dict, rank: int, threads: int | None = None) -> StageModel:
    config = json.loads((Path(folder) / "genai_config.json").read_text())
    return StageModel(Path(folder) / split["stages"][rank]["file"], config["model"]["decoder"], threads)


def link_specs(split: dict, link: int) -> list[dict]:
    return split["links"][link]["tensors"]


def send_tensors(arrays: list[np.ndarray], dst: int) -> int:
    import torch
    import torch.distributed as dist

    sent = 0
    for array in arrays:
        array = np.ascontiguousarray(array)
        dist.send(torch.from_numpy(array), dst)
        sent += array.nbytes
    return sent


def recv_tensors(specs: list[dict], leading: tuple[int, ...], src: int) -> dict[str, np.ndarray]:
    """Tensors of `specs` whose symbolic leading dims are `leading` (batch, new tokens)."""
    import torch
    import torch.distributed as dist

    out = {}
    for spec in specs:
        fixed = [d for d in spec["shape"] if isinstance(d, int)]
        buffer = torch.from_numpy(np.empty((*leading, *fixed), NUMPY[spec["dtype"]]))
        dist.recv(buffer, src)
        out[spec["name"]] = buffer.numpy()
    return out


def send_header(values: list[int], dst: int) -> None:
    import torch
    import torch.distributed as dist

    dist.send(torch.tensor(values + [0] * (HEADER - len(values)), dtype=torch.int64), dst)


def recv_header(src: int) -> list[int]:
    import torch
    import torch.distributed as dist

    header = torch.zeros(HEADER, dtype=torch.int64)
    dist.recv(header, src)
    return [int(v) for v in header]


class Counters:
    """What a stage measures: its peak RSS, that once torch and onnxruntime are imported (what
    any stage process costs before its model) and once its session is loaded, the activation
    bytes it sent down the chain and the tokens it passed on."""

    def __init__(self):
        import onnxruntime  # noqa: F401  (the imports every stage pays for, measured here)
        import torch.distributed  # noqa: F401

        from compressor.core.memory import own_peak_rss_bytes

        self.peak = own_peak_rss_bytes
        self.rss_imported = own_peak_rss_bytes()
        self.rss_loaded = self.sent_bytes = self.sent_tokens = 0

    def as_array(self) -> np.ndarray:
        return np.array([self.peak(), self.rss_imported, self.rss_loaded, self.sent_bytes,
                         self.sent_tokens], np.float64)


def serve(stage: StageModel, split: dict, rank: int, counters: Counters) -> None:
    """A stage k > 0: receive, run, pass on (or return the result to rank 0), until STOP."""
    world = len(split["stages"])
    last = rank == world - 1
    eos_ids = split.get("eos_ids", [])
    while True:
        header = recv_header(rank - 1)
        op, batch, new, total, want = header
        if not last:
            send_header(header, rank + 1)
        if op == OP_STOP:
            return
        if op == OP_STATS:
            send_tensors([counters.as_array()], 0)
            continue
        received = recv_tensors(link_specs(split, rank - 1), (batch, new), rank - 1)
        out = stage.run(batch, total, received)
        if last:
            send_tensors([result_of(out["logits"], want, eos_ids)], 0)
        else:
            names = split["stages"][rank]["sends"]
            arrays = [out[n] if n in out else received[n] for n in names]
            counters.sent_bytes += send_tensors(arrays, rank + 1)
            counters.sent_tokens += batch * new


def result_of(logits: np.ndarray, want: int, eos_ids: list[int]) -> np.ndarray:
    """What the last stage returns: float32 logits, or the greedy next token of each row
    (end-of-sequence ids masked out for WANT_TOKEN_NO_EOS)."""
    if want == WANT_LOGITS:
        return logits.astype(np.float32)
    last = logits[:, -1].astype(np.float32)
    if want == WANT_TOKEN_NO_EOS and eos_ids:
        last[:, eos_ids] = -np.inf
    return last.argmax(-1).astype(np.int64)


def connect(host: str, port: int, world: int, timeout: float, master: bool):
    import torch.distributed as dist

    return dist.TCPStore(host, port, world, is_master=master, timeout=timedelta(seconds=timeout),
                         wait_for_workers=False)


def worker_main(folder: Path, rank: int, host: str, port: int, timeout: float,
                threads: int | None = None) -> int:
    """A stage process: its session, `ready/rank` in the store, the gloo group, serve()."""
    import torch.distributed as dist

    split = read_split(folder)
    world = len(split["stages"])
    if not 0 < rank < world:
        print(f"error: --rank {rank}: this split has stages 1-{world - 1} to serve (rank 0 "
              "is `compress generate`)", file=sys.stderr)
        return 2
    try:
        store = connect(host, port, world, timeout, master=False)
    except Exception as exc:   # torch raises RuntimeError / DistStoreError / TimeoutError
        print(f"error: stage {rank}: cannot reach rank 0 at {host}:{port} ({exc})", file=sys.stderr)
        return 2
    counters = Counters()
    try:
        stage = open_stage(folder, split, rank, threads)
    except Exception as exc:   # noqa: BLE001  (any load failure is reported to rank 0)
        store.set(f"error/{rank}", str(exc)[:300])
        print(f"error: stage {rank}: {exc}", file=sys.stderr)
        return 2
    counters.rss_loaded = counters.peak()
    store.set(f"ready/{rank}", "1")
    try:
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout))
        serve(stage, split, rank, counters)
    except Exception as exc:   # noqa: BLE001  (a neighbour went away: gloo's RuntimeError)
        _say(store, f"lost/{rank}", str(exc)[:300])
        print(f"error: stage {rank}: lost the pipeline ({str(exc).strip()[:200]})", file=sys.stderr)
        return PEER_LOST
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


def _say(store, key: str, value: str) -> None:
    try:
        store.set(key, value)
    except Exception:   # noqa: BLE001  (rank 0, the store's host, may be gone too)
        return


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="serve one stage of a split model")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--master", required=True, help="HOST:PORT of rank 0")
    parser.add_argument("--timeout", type=float, default=20.0)
    parser.add_argument("--threads", type=int)
    args = parser.parse_args(argv)
    host, _, port = args.master.rpartition(":")
    return worker_main(args.folder, args.rank, host, int(port), args.timeout, args.threads)


if __name__ == "__main__":
    sys.exit(main())

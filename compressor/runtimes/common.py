"""Code both artifact formats share: file facts, weight summaries, kernel search, memory
liveness, batching and latency timing. Pure numpy; no runtime is imported here.

Each format reduces its graph to the same plain shapes: `ops` as a list of
(op_type, input_ids, output_ids) in execution order, constant tensor ids, and byte sizes of
the activation tensors. Everything below works on those lists, and so does runtimes/macs.py's
MAC count.
"""
from __future__ import annotations

import gzip
import hashlib
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from compressor.errors import DataError
from compressor.core.tensors import matched
from compressor.runtimes.base import WeightTensor
from compressor.runtimes.macs import Op

# Memory a runtime needs for one model besides its weights and activations, once the runtime
# is imported: interpreter / session objects, thread pool, allocator slack and the code pages
# of the kernels that first run touches. Measured as the peak RSS growth of loading and
# running a ~1 k-parameter model once in a process that has already imported the runtime
# (x86_64, Python 3.11): LiteRT 2.3 ~3.3 MiB, onnxruntime 1.32 ~10.2 MiB; rounded up, so a
# budget check errs towards "does not fit". Importing the runtime itself (LiteRT ~17 MiB,
# onnxruntime ~24 MiB) is not counted: it is paid once per process whatever the model, and the
# device profiles reserve memory for the runtime's libraries outside `model_share`.
RUNTIME_OVERHEAD_BYTES = {"tflite": 4 * 2**20, "onnx": 11 * 2**20, "gguf": 8 * 2**20}


class _ByteCounter:
    """A write-only sink that only counts what gzip writes into it."""

    def __init__(self) -> None:
        self.count = 0

    def write(self, data: bytes) -> int:
        self.count += len(data)
        return len(data)

    def flush(self) -> None:
        pass


def file_facts(path: Path) -> tuple[int, int, str]:
    """(raw size, gzip level-9 size, sha256 hex) of the file's bytes, read in chunks."""
    sha, counter, size = hashlib.sha256(), _ByteCounter(), 0
    with open(path, "rb") as f, gzip.GzipFile(fileobj=counter, mode="wb", compresslevel=9, mtime=0) as gz:
        while chunk := f.read(1 << 22):
            sha.update(chunk)
            gz.write(chunk)
            size += len(chunk)
    return size, counter.count, sha.hexdigest()


def count_zeros(values: np.ndarray, zero_point: np.ndarray | float = 0, axis: int = 0) -> int:
    """Elements equal to zero, or for quantized tensors to their zero point.

    `zero_point` is a scalar or one value per slice along `axis` (per-channel quantization).
    """
    values = np.asarray(values)
    zp = np.asarray(zero_point).reshape(-1)
    if zp.size <= 1 or values.ndim == 0:
        return int(np.count_nonzero(values == (zp[0] if zp.size else 0)))
    axis = axis % values.ndim
    if values.shape[axis] != zp.size:   # metadata we cannot line up: fall back to plain zeros
        return int(np.count_nonzero(values == 0))
    shape = [1] * values.ndim
    shape[axis] = zp.size
    return int(np.count_nonzero(values == zp.reshape(shape)))


def find_kernels(ops: Sequence[Op], constants: Iterable, kernel_inputs: Mapping[str, Sequence[int]],
                 passthrough: Mapping[str, int]) -> set:
    """Ids of constant tensors that are the weight input of a conv / dense / matmul op.

    A weight may reach its op through dequantize / cast / transpose ops (fp16 TFLite, QDQ
    ONNX): `passthrough` maps those op types to the input index to follow back.
    """
    constants = set(constants)
    producer = {out: op for op in ops for out in op[2]}
    return {kernel for _, kernel in _kernel_uses(ops, constants, producer, kernel_inputs, passthrough)}


def _kernel_uses(ops: Sequence[Op], constants: set, producer: Mapping,
                 kernel_inputs: Mapping[str, Sequence[int]], passthrough: Mapping[str, int]):
    """(op, constant id) for each op that reads a constant weight at one of its kernel inputs."""
    for op in ops:
        op_type, inputs, _ = op
        for index in kernel_inputs.get(op_type, ()):
            if index >= len(inputs):
                continue
            tensor, seen = inputs[index], 0
            while tensor not in constants and tensor in producer and seen < 8:
                src_type, src_inputs, _ = producer[tensor]
                if src_type not in passthrough or passthrough[src_type] >= len(src_inputs):
                    break
                tensor, seen = src_inputs[passthrough[src_type]], seen + 1
            if tensor in constants:
                yield op, tensor


def weight_summary(weights: Sequence[WeightTensor]) -> tuple[int, dict[str, float], float]:
    """(params, dtype -> fraction of weight elements, zero fraction over kernel tensors)."""
    params = sum(w.size for w in weights)
    by_dtype: dict[str, int] = {}
    for w in weights:
        by_dtype[w.dtype] = by_dtype.get(w.dtype, 0) + w.size
    fractions = {k: round(v / params, 6) for k, v in sorted(by_dtype.items(), key=lambda kv: -kv[1])}
    kernel_elems = sum(w.size for w in weights if w.is_kernel)
    kernel_zeros = sum(w.zeros for w in weights if w.is_kernel)
    return params, fractions, (kernel_zeros / kernel_elems if kernel_elems else 0.0)


def peak_live_bytes(ops: Sequence[Op], sizes: Mapping, graph_inputs: Iterable = (),
                    graph_outputs: Iterable = (), persistent: Iterable = ()) -> int:
    """Largest sum of live activation bytes at any op, walking ops in execution order.

    A tensor is live from the op that produces it to the last op that consumes it (both
    inclusive); graph inputs are live from the start, graph outputs to the end, and
    `persistent` tensors (computed once from constants, kept by the runtime) throughout.
    Only tensors in `sizes` count, so the caller leaves constants out.
    """
    last = max(len(ops) - 1, 0)
    start: dict = {t: 0 for t in graph_inputs if t in sizes}
    end: dict = {}
    for i, (_, inputs, outputs) in enumerate(ops):
        for t in outputs:
            start.setdefault(t, i)
        for t in inputs:
            end[t] = i
    for t in graph_outputs:
        end[t] = last
    for t in persistent:
        start[t], end[t] = 0, last
    delta = np.zeros(last + 2, dtype=np.int64)   # +size where a tensor becomes live, -size after
    for t, s in start.items():
        if t in sizes:
            delta[s] += sizes[t]
            delta[max(end.get(t, s), s) + 1] -= sizes[t]
    return int(np.cumsum(delta)[: last + 1].max(initial=0))


def default_threads(threads: int | None) -> int:
    """`threads` if given, else the cores this process may run on."""
    if threads is not None:
        if int(threads) < 1:
            raise DataError(f"threads = {threads}, but it must be at least 1 (or None for all cores)")
        return int(threads)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def as_input_list(x, names: Sequence[str]) -> list[np.ndarray]:
    """One array per model input, in the model's order, from an array, a sequence or a dict
    (matched by name, by position when the names differ)."""
    if isinstance(x, (list, tuple)) and len(names) > 1:
        x = dict(zip(names, x))
    arrays = matched(x, names)
    if len({len(a) for a in arrays}) > 1:
        raise DataError(f"inputs have different batch sizes: {[len(a) for a in arrays]}")
    return arrays


def fixed_batch_of(inputs: Sequence[Mapping]) -> int | None:
    """The batch size every call needs when an artifact's inputs fix it (litert-torch exports
    batch 1); None when it is dynamic (-1) or the inputs have no batch dimension."""
    first = [int(io["shape"][0]) for io in inputs if io.get("shape")]
    return None if not first or any(d < 1 for d in first) else first[0]


def predict_in_batches(run: Callable[[list[np.ndarray]], list[np.ndarray]], inputs: list[np.ndarray],
                       batch_size: int, fixed_batch: int | None, output_names: Sequence[str]):
    """Run `run` over batches and join its outputs along axis 0.

    Models with a fixed batch dimension get exactly that many rows per call; the last batch
    is padded with zeros and the padding cut from the outputs. Returns one array for a
    single-output model, else a dict name -> array in the model's output order.
    """
    if batch_size < 1:
        raise DataError(f"batch_size = {batch_size}, but it must be at least 1")
    step = fixed_batch or batch_size
    n = len(inputs[0])
    chunks: list[list[np.ndarray]] = []
    for lo in range(0, n, step):
        batch = [a[lo:lo + step] for a in inputs]
        rows = len(batch[0])
        if fixed_batch and rows < fixed_batch:
            batch = [np.concatenate([b, np.zeros((fixed_batch - rows, *b.shape[1:]), b.dtype)]) for b in batch]
        chunks.append([o[:rows] for o in run(batch)])
    if not chunks:
        raise DataError("predict got an empty batch (0 samples)")
    outputs = [np.concatenate(parts) for parts in zip(*chunks)]
    return outputs[0] if len(outputs) == 1 else dict(zip(output_names, outputs))


def time_calls(call: Callable[[], object], warmup: int, runs: int) -> dict[str, float]:
    """{"p50", "p90"} in milliseconds of `call` timed with perf_counter after `warmup` calls."""
    if runs < 1 or warmup < 0:
        raise DataError(f"latency needs runs >= 1 and warmup >= 0 (got runs={runs}, warmup={warmup})")
    for _ in range(warmup):
        call()
    times = np.empty(runs)
    for i in range(runs):
        t0 = time.perf_counter()
        call()
        times[i] = time.perf_counter() - t0
    return {"p50": float(np.percentile(times, 50) * 1e3), "p90": float(np.percentile(times, 90) * 1e3)}

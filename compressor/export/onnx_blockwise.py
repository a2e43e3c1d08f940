"""Blockwise int8 MatMuls for dynamic int8 ONNX: onnxruntime's MatMulNBits (com.microsoft)
with 8-bit weights in blocks along K, a float scale per block, and accuracy_level 4: the
kernel quantizes each activation row to int8 per block of K as well and multiplies int8 x
int8. Far finer than MatMulInteger's one run-time scale for a whole activation tensor, so
outlier channels cost only their own block (all-MiniLM-L6-v2: mean cosine 0.9991 vs 0.9930);
on x86 CPUs its 8-bit kernel is ~2x slower than MatMulInteger, hence the mixed candidate
(onnx_candidates.py): dynamic int8 everywhere but the matmuls where blockwise gains most per
multiply. Also: batch-1 latency of candidate files, which the choice between them reads.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np

BITS = 8
ACCURACY_LEVEL = 4          # int8 x int8 compute, activations quantized per block of K
MAX_BLOCK, MIN_BLOCK = 128, 16   # MatMulNBits' blocks: powers of two, at least 16
TIMING_ROUNDS, TIMING_RUNS, WARMUP = 7, 20, 5


def constant_matmuls(path: Path, excluded: Collection[str] = ()) -> dict[str, tuple[int, int]]:
    """{node name: (K, N)} of the MatMuls whose B is a 2-D float32 initializer (weights), but
    `excluded`; MatMulNBits takes only those."""
    import onnx

    graph = onnx.load(str(path)).graph
    weights = {init.name: init for init in graph.initializer
               if init.data_type == onnx.TensorProto.FLOAT and len(init.dims) == 2}
    return {node.name: tuple(weights[node.input[1]].dims) for node in graph.node
            if node.op_type == "MatMul" and node.domain in ("", "ai.onnx")
            and len(node.input) > 1 and node.input[1] in weights and node.name not in excluded}


def block_size(shapes: Collection[tuple[int, int]]) -> int:
    """The largest power of two <= every K, within MIN_BLOCK..MAX_BLOCK: a block longer than K
    is padded with zeros (stored bytes for nothing; a 64-wide model's file would double)."""
    shortest = min(k for k, _ in shapes)
    block = MAX_BLOCK
    while block > MIN_BLOCK and block > shortest:
        block //= 2
    return block


def blockwise(proto: Any, nodes: Collection[str], block: int) -> Any:
    """`proto` with the MatMuls named in `nodes` (constant float weights) as MatMulNBits,
    8-bit symmetric weights in blocks of `block` along K, accuracy_level 4; returns the new
    ModelProto (onnxruntime's MatMulNBitsQuantizer)."""
    quantizer_class = _quantizer_class()
    quantizer = quantizer_class(proto, bits=BITS, block_size=block, is_symmetric=True,
                                accuracy_level=ACCURACY_LEVEL, nodes_to_include=sorted(nodes),
                                op_types_to_quantize=("MatMul",))
    quantizer.process()
    return quantizer.model.model


def available() -> str | None:
    """None when onnxruntime's quantizer writes 8-bit MatMulNBits, else why not."""
    try:
        _quantizer_class()
    except ImportError as exc:
        return f"onnxruntime has no MatMulNBitsQuantizer ({exc})"
    return None


def _quantizer_class() -> Any:
    """MatMulNBitsQuantizer, imported without the INFO logging its module switches on for
    the whole process (logging.basicConfig at import) and with its own per-node lines quiet."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)
    root.setLevel(level)
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    return MatMulNBitsQuantizer


def p50_ms(paths: Sequence[Path], feed: dict[str, np.ndarray], rounds: int = TIMING_ROUNDS,
           runs: int = TIMING_RUNS) -> list[float]:
    """Batch-1 median latency of each file in onnxruntime (CPU, 1 thread), in ms: the files
    timed round-robin (`rounds` rounds of `runs` runs) so load drifts hit them
    alike, each file's lowest round median (its quietest round: on a shared machine other
    processes only ever add time, and the median of rounds flipped a 1.25x bound)."""
    import onnxruntime as ort

    sessions = []
    for path in paths:
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        options.log_severity_level = 3
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        names = [value.name for value in session.get_inputs()]
        sessions.append((session, {name: feed[name] for name in names}))
        for _ in range(WARMUP):
            session.run(None, sessions[-1][1])
    medians: list[list[float]] = [[] for _ in paths]
    for _ in range(rounds):
        for index, (session, inputs) in enumerate(sessions):
            times = []
            for _ in range(runs):
                started = time.perf_counter()
                session.run(None, inputs)
                times.append(time.perf_counter() - started)
            medians[index].append(float(np.median(times)) * 1e3)
    return [round(min(m), 4) for m in medians]


def write_blockwise(proto: Any, out_path: Path, nodes: Collection[str],
                    excluded: Collection[str], block: int) -> None:
    """`proto` with `nodes` as blockwise int8 MatMulNBits (onnx_blockwise.py), then every
    weight and table still float as int8 behind DequantizeLinear, saved to `out_path`."""
    import onnx

    from compressor.export.onnx_compact import narrow_side_params
    from compressor.export.onnx_weight_only import (WEIGHT_OPS, store_int8_tables,
                                                    store_int8_weights)

    proto = blockwise(proto, nodes, block)
    store_int8_weights(proto, set(excluded), WEIGHT_OPS)
    store_int8_tables(proto, set(excluded))
    narrow_side_params(proto)
    onnx.save(proto, str(out_path))

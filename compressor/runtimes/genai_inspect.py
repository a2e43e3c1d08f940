"""What an onnxruntime-genai folder holds, read back from its files.

Weights: every initializer of model.onnx (its data file read tensor by tensor), with the
packed integers of MatMulNBits (B) and GatherBlockQuantized (data) counted as "int4" /
"int8" (the node's `bits`) with their unpacked element count [N, K], and zeros counted
against their zero points. Not weights: those ops' scales and zero points (the encoding of
their integers, in the size but not the share of weight bytes at 4 bits) and the rotary
cos / sin tables (derived from rope_theta, not in the checkpoint either).
"""
from __future__ import annotations

import gzip
import hashlib
from collections import Counter
from pathlib import Path

import numpy as np

from compressor.core.kernel_ops import ONNX_PASSTHROUGH
from compressor.runtimes.base import ArtifactInfo, WeightTensor
from compressor.runtimes.common import RUNTIME_OVERHEAD_BYTES, _ByteCounter, weight_summary
from compressor.runtimes.genai import kv_cache_bytes, read_config
from compressor.runtimes.macs import kernel_macs

QUANTIZED_OPS = ("MatMulNBits", "GatherBlockQuantized")
ROTARY_TABLES = ("cos_cache", "sin_cache")
PREFILL_TOKENS = 512   # the prefill the memory estimate allows activations for


def folder_facts(folder: Path) -> tuple[int, int, str]:
    """(bytes, gzip level-9 bytes, sha256) over the folder's files in name order."""
    sha, total, gz_total = hashlib.sha256(), 0, 0
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        counter = _ByteCounter()
        sha.update(path.relative_to(folder).as_posix().encode() + b"\0")
        with open(path, "rb") as f, gzip.GzipFile(fileobj=counter, mode="wb", compresslevel=9,
                                                  mtime=0) as gz:
            while chunk := f.read(1 << 22):
                sha.update(chunk)
                gz.write(chunk)
                total += len(chunk)
        gz_total += counter.count
    return total, gz_total, sha.hexdigest()


def inspect_genai(folder: Path) -> ArtifactInfo:
    import onnx
    from onnx import numpy_helper
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    folder = Path(folder)
    config = read_config(folder)
    decoder = config["model"]["decoder"]
    model_path = folder / decoder.get("filename", "model.onnx")
    model = onnx.load(str(model_path), load_external_data=False)
    graph = model.graph
    packed = _packed_inputs(graph)           # tensor -> (bits, N, K, zero point tensor)
    encodings = _encoding_inputs(graph)      # scales / zero points of the packed ops
    # float16 weights reach their MatMul / Gather through a Cast (genai_fp16.py), which
    # onnxruntime folds at load: float32 in memory
    cast_from = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Cast"}
    kernels = {cast_from.get(n.input[1], n.input[1]) for n in graph.node
               if n.op_type in ("MatMul", "MatMulNBits") and len(n.input) > 1}
    kernels |= {cast_from.get(n.input[0], n.input[0]) for n in graph.node if n.op_type == "Gather"}
    inits = {t.name: t for t in graph.initializer}
    folded = {name for name in cast_from.values() if name in inits}

    def array(tensor) -> np.ndarray:
        if uses_external_data(tensor):
            tensor = onnx.TensorProto.FromString(tensor.SerializeToString())
            load_external_data_for_tensor(tensor, str(folder))
        return numpy_helper.to_array(tensor)

    weights, weight_bytes = [], 0
    for tensor in graph.initializer:
        values = array(tensor)
        weight_bytes += values.size * 4 if tensor.name in folded else values.nbytes
        if tensor.name in encodings or tensor.name.startswith(ROTARY_TABLES):
            continue
        if tensor.name in packed:
            bits, n, k, block, zp_name = packed[tensor.name]
            zeros = _packed_zeros(values, bits, (n, k, block),
                                  array(inits[zp_name]) if zp_name in inits else None)
            weights.append(WeightTensor(tensor.name, f"int{bits}", (n, k), zeros, True,
                                        reader=_reader(graph, tensor.name)))
            continue
        is_kernel = tensor.name in kernels and values.ndim == 2
        weights.append(WeightTensor(tensor.name, values.dtype.name, tuple(values.shape),
                                    int(np.count_nonzero(values == 0)) if is_kernel else 0,
                                    is_kernel, reader=_reader(graph, tensor.name)))
    # multiply-accumulates per token (one position per op), by runtimes/macs.py's table; a
    # packed B counts as the [N, K] it encodes
    shapes = {t.name: tuple(t.dims) for t in graph.initializer}
    shapes.update({name: (n, k) for name, (_, n, k, _, _) in packed.items()})
    macs = kernel_macs([(n.op_type, list(n.input), list(n.output)) for n in graph.node],
                       shapes, None, ONNX_PASSTHROUGH)
    size, gzip_size, sha = folder_facts(folder)
    params, dtypes, sparsity = weight_summary(weights)
    vocab, hidden = int(config["model"]["vocab_size"]), int(decoder["hidden_size"])
    activations = PREFILL_TOKENS * (vocab + 8 * hidden) * 4   # prefill logits + hidden states
    return ArtifactInfo(
        format="onnx", path=folder, size_bytes=size, gzip_bytes=gzip_size, sha256=sha,
        params=params, weight_dtypes=dtypes, sparsity=sparsity,
        ops=dict(Counter(n.op_type for n in graph.node)),
        inputs=_io(graph.input, set(inits)), outputs=_io(graph.output, set()),
        est_peak_memory_bytes=weight_bytes + kv_cache_bytes(folder, config) + activations
        + RUNTIME_OVERHEAD_BYTES["onnx"],
        macs=macs, weights=tuple(weights))


def _packed_inputs(graph) -> dict[str, tuple[int, int, int, int, str]]:
    """Packed integer tensor -> (bits, N, K, block, zero-point tensor) for MatMulNBits B and
    GatherBlockQuantized data (through the Reshape a tied embedding reads the lm_head with)."""
    found = {}
    for node in graph.node:
        if node.op_type == "MatMulNBits":
            attrs = {a.name: a.i for a in node.attribute}
            zp = node.input[3] if len(node.input) > 3 else ""
            found[node.input[1]] = (attrs.get("bits", 4), attrs["N"], attrs["K"],
                                    attrs["block_size"], zp)
    producers = {out: n for n in graph.node for out in n.output}
    inits = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type != "GatherBlockQuantized":
            continue
        data = node.input[0]
        if data in producers and producers[data].op_type == "Reshape":
            data = producers[data].input[0]   # the lm_head's B: already counted once
        if data in found or data not in inits:
            continue
        attrs = {a.name: a.i for a in node.attribute}
        bits = attrs.get("bits", 4)
        rows, row_bytes = inits[data].dims[0], int(np.prod(inits[data].dims[1:]))
        zp = node.input[3] if len(node.input) > 3 else ""
        found[data] = (bits, rows, row_bytes * 8 // bits, attrs["block_size"], zp)
    return found


def _encoding_inputs(graph) -> set[str]:
    return {name for n in graph.node if n.op_type in QUANTIZED_OPS for name in n.input[2:4] if name}


def _packed_zeros(values: np.ndarray, bits: int, shape: tuple[int, int, int], zero_points) -> int:
    """Elements equal to their block's zero point (2**(bits-1) when the op has none)."""
    n, k, block = shape
    q = _unpacked(values.reshape(n, -1), bits)[:, :k]
    if zero_points is None:
        return int(np.count_nonzero(q == (1 << (bits - 1))))
    blocks = -(-k // block)
    zp = _unpacked(zero_points.reshape(n, -1), bits)[:, :blocks]
    return int(np.count_nonzero(q == np.repeat(zp, block, axis=1)[:, :k]))


def _unpacked(rows: np.ndarray, bits: int) -> np.ndarray:
    """uint8 rows -> one value per element (4-bit: the low nibble first)."""
    if bits == 8:
        return rows
    return np.stack([rows & 0xF, rows >> 4], -1).reshape(rows.shape[0], -1)


def _reader(graph, name: str) -> str:
    node = next((n for n in graph.node if name in n.input), None)
    return f"{node.op_type} {node.name}" if node is not None else ""


def _io(values, initializers: set[str]) -> list[dict]:
    import onnx

    out = []
    for v in values:
        if v.name in initializers:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in v.type.tensor_type.shape.dim]
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)).name
        out.append({"name": v.name, "shape": dims, "dtype": dtype})
    return out

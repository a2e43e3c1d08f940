"""Put compressor's own integers into a float LLM .tflite, in the layout LiteRT's kernels
read (the one ai-edge-quantizer writes), instead of letting a quantizer round the float
weights a second time on its own grid.

- int8: FULLY_CONNECTED / EMBEDDING_LOOKUP weights INT8 with one float32 scale per output
  row, zero point 0 (LiteRT's dynamic-range kernels: activations are quantized per row at
  run time, weights stay as stored).
- int4: INT4 packed two to a byte (element 2i in the low nibble), zero point 0, with a
  FLOAT16 scale tensor [rows, K / block] (BlockwiseQuantization, block 32 / 64 / 128 / 256)
  or one float32 scale per row (per channel, block = K).
- float16: FLOAT16 weights behind a DEQUANTIZE op (LiteRT restores float32 at load time).

Which buffer holds which parameter is found by content: the float model was traced from a
checkpoint holding exactly the dequantized weights, so each weight buffer's bytes equal its
parameter's float32 bytes. One buffer serves every signature (prefill, decode) and, for tied
embeddings, both the embedding lookup and the lm_head.
"""
from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from compressor.decoders.footprint_tflite import LITERT_BLOCKS
from compressor.export.tflite import opcode_index

BLOCKS = LITERT_BLOCKS                            # blockwise sizes LiteRT's int4 kernels take
WEIGHT_READERS = {"FULLY_CONNECTED": 1, "EMBEDDING_LOOKUP": 1}   # op -> weight input index
FLATBUFFER_LIMIT = 2 ** 31 - 1
# XNNPACK refuses zero and subnormal scales ("unsupported scale value"): all-zero blocks
# (a padding embedding row) get these instead, which leaves their weights zero
BLOCK_SCALE_FLOOR = np.float32(2 ** -14)        # float16's smallest normal number
CHANNEL_SCALE_FLOOR = np.float32(1e-20)


@dataclass(frozen=True)
class LiteRtWeight:
    """A weight on LiteRT's symmetric grid: w = values * scales (per row, or per block)."""

    values: np.ndarray      # int8 [N, K], in [-8, 7] for 4 bits
    scales: np.ndarray      # float32 [N, K / block]
    bits: int
    block: int              # == K: per channel


def digest(array: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(array).view(np.uint8).data, digest_size=16).digest()


def read(path: Path):
    """The .tflite as a schema object tree (ModelT), buffers stored past the flatbuffer
    (files over 2 GB) read in."""
    from ai_edge_litert import schema_py_generated as schema

    raw = Path(path).read_bytes()
    model = schema.ModelT.InitFromPackedBuf(bytearray(raw), 0)
    for buffer in model.buffers:
        if buffer.offset and buffer.offset > 1:
            buffer.data = np.frombuffer(raw, np.uint8, buffer.size, buffer.offset).copy()
            buffer.offset = buffer.size = 0
    return model


def write(model, path: Path) -> Path:
    import flatbuffers

    total = sum(len(b.data) for b in model.buffers if b.data is not None)
    if total > FLATBUFFER_LIMIT:
        from compressor.errors import BackendUnavailableError

        raise BackendUnavailableError(f"the .tflite would hold {total / 2**30:.1f} GiB of "
                                      "weights, over the 2 GiB a flatbuffer can; export int4")
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    Path(path).write_bytes(builder.Output())
    return Path(path)


def weight_buffers(model) -> dict[int, list[tuple[int, int]]]:
    """Buffer index -> [(subgraph, tensor)] of the constant weights FULLY_CONNECTED and
    EMBEDDING_LOOKUP ops read, only for buffers no other kind of op reads (those must stay
    float: the kernels reading them take no integers)."""
    from ai_edge_litert import schema_py_generated as schema

    names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    readers: dict[int, list[tuple[int, int]]] = {}
    others: set[int] = set()
    for g, graph in enumerate(model.subgraphs):
        for op in graph.operators or []:
            code = model.operatorCodes[op.opcodeIndex]
            name = names.get(max(code.builtinCode, code.deprecatedBuiltinCode))
            for position, t in enumerate(op.inputs if op.inputs is not None else []):
                if t < 0:
                    continue
                buffer = graph.tensors[t].buffer
                data = model.buffers[buffer].data
                if not buffer or data is None or not len(data):
                    continue
                if WEIGHT_READERS.get(name) == position:
                    readers.setdefault(buffer, []).append((g, t))
                else:
                    others.add(buffer)
    return {b: sorted(set(uses)) for b, uses in readers.items() if b not in others}


def store_integers(model, weights: dict[bytes, LiteRtWeight],
                   floats: Callable[[bytes], np.ndarray] | None = None) -> dict[bytes, int]:
    """Replace every weight buffer whose float32 content has a digest in `weights` with its
    integers; returns digest -> buffers stored. A buffer holding a constant multiple c of a
    weight (the converter folds `logits / softcap` into Gemma 2's lm_head, which then no
    longer shares the embedding's table) gets the same integers with scales x c, when
    `floats(digest)` gives the weights to compare with."""
    found: dict[bytes, int] = {}
    unmatched = []
    for buffer, uses in weight_buffers(model).items():
        shape = tuple(model.subgraphs[uses[0][0]].tensors[uses[0][1]].shape)
        key = digest(model.buffers[buffer].data)
        weight = weights.get(key)
        if weight is None or shape != weight.values.shape:
            unmatched.append((buffer, uses, shape))
            continue
        found[key] = found.get(key, 0) + 1
        _store(model, buffer, uses, weight)
    for buffer, uses, shape in unmatched if floats else ():
        data = np.frombuffer(model.buffers[buffer].data.tobytes(), np.float32).reshape(shape)
        for key, weight in weights.items():
            factor = _multiple_of(data, floats(key)) if weight.values.shape == shape else None
            if factor is not None:
                found[key] = found.get(key, 0) + 1
                _store(model, buffer, uses, dataclasses.replace(
                    weight, scales=(weight.scales * factor).astype(np.float32)))
                break
    return found


def _multiple_of(data: np.ndarray, weight: np.ndarray) -> float | None:
    """c where data == c * weight (to float32 rounding), else None."""
    largest = np.unravel_index(np.argmax(np.abs(weight)), weight.shape)
    if not weight[largest]:
        return None
    factor = float(data[largest] / weight[largest])
    close = np.allclose(data, weight * np.float32(factor), rtol=1e-5, atol=1e-7 * abs(factor))
    return factor if factor > 0 and close else None


def _store(model, buffer: int, uses: list[tuple[int, int]], weight: LiteRtWeight) -> None:
    from ai_edge_litert import schema_py_generated as schema

    values = weight.values.astype(np.int8)
    if weight.bits == 4:
        flat = values.reshape(-1).astype(np.uint8) & 0x0F
        if flat.size % 2:
            flat = np.append(flat, np.uint8(0))
        model.buffers[buffer].data = (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)
    else:
        model.buffers[buffer].data = values.reshape(-1).view(np.uint8)
    per_channel = weight.block == values.shape[1]
    scales = np.maximum(weight.scales, CHANNEL_SCALE_FLOOR if per_channel else BLOCK_SCALE_FLOOR)
    scale_buffer = None
    if not per_channel:
        scale_buffer = _new_buffer(model, scales.astype(np.float16).view(np.uint8).reshape(-1))
    for g, t in uses:
        tensor = model.subgraphs[g].tensors[t]
        tensor.type = schema.TensorType.INT4 if weight.bits == 4 else schema.TensorType.INT8
        q = schema.QuantizationParametersT()
        q.quantizedDimension = 0
        if per_channel:
            q.scale = scales.reshape(-1).astype(np.float32)
            q.zeroPoint = np.zeros(values.shape[0], np.int64)
        else:
            table = schema.TensorT()
            table.name = (tensor.name or b"") + b"_scales"
            table.shape = np.array(scales.shape, np.int32)
            table.type, table.buffer = schema.TensorType.FLOAT16, scale_buffer
            model.subgraphs[g].tensors.append(table)
            details = schema.BlockwiseQuantizationT()
            details.scales = len(model.subgraphs[g].tensors) - 1
            details.zeroPoints, details.blockSize = -1, weight.block
            q.detailsType, q.details = schema.QuantizationDetails.BlockwiseQuantization, details
        tensor.quantization = q


def store_float16(model) -> int:
    """Every FULLY_CONNECTED / EMBEDDING_LOOKUP float32 weight stored as FLOAT16 behind a
    DEQUANTIZE (one float16 buffer per weight, one DEQUANTIZE per signature reading it);
    returns how many weights."""
    from ai_edge_litert import schema_py_generated as schema

    dequantize = opcode_index(model, schema.BuiltinOperator.DEQUANTIZE, schema)
    count = 0
    for buffer, uses in weight_buffers(model).items():
        first = model.subgraphs[uses[0][0]].tensors[uses[0][1]]
        if first.type != schema.TensorType.FLOAT32:
            continue
        values = np.frombuffer(model.buffers[buffer].data.tobytes(), np.float32)
        half = _new_buffer(model, values.astype(np.float16).view(np.uint8))
        model.buffers[buffer].data = None
        for g, t in uses:
            graph, tensor = model.subgraphs[g], model.subgraphs[g].tensors[t]
            stored = schema.TensorT()
            stored.name, stored.shape = (tensor.name or b"") + b"_fp16", tensor.shape
            stored.type, stored.buffer = schema.TensorType.FLOAT16, half
            graph.tensors.append(stored)
            tensor.buffer = 0                    # now computed by the DEQUANTIZE at load time
            op = schema.OperatorT()
            op.opcodeIndex, op.inputs, op.outputs = dequantize, [len(graph.tensors) - 1], [t]
            graph.operators.insert(0, op)
        count += 1
    return count


def add_metadata(model, entries: dict[str, bytes]) -> None:
    """Named byte strings in the file's metadata table (tokenizer files, LM facts)."""
    from ai_edge_litert import schema_py_generated as schema

    model.metadata = list(model.metadata or [])
    for name, data in entries.items():
        entry = schema.MetadataT()
        entry.name = name.encode() if isinstance(name, str) else name
        entry.buffer = _new_buffer(model, np.frombuffer(data, np.uint8).copy())
        model.metadata.append(entry)


def _new_buffer(model, data: np.ndarray) -> int:
    from ai_edge_litert import schema_py_generated as schema

    buffer = schema.BufferT()
    buffer.data, buffer.offset, buffer.size = data, 0, 0
    model.buffers.append(buffer)
    return len(model.buffers) - 1

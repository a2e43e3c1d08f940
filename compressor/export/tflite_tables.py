"""int8 constant tables in a TFLite file, which ai-edge-quantizer's dynamic / weight-only
modes (and QAT conversions) leave float32: `int8_tables`.

- Embedding tables: the converter writes a lookup as GATHER(float32 table, ids), and
  ai-edge-quantizer quantizes GATHER tables only in its static int8 mode. LiteRT's
  EMBEDDING_LOOKUP reads an int8 table with one scale per row and writes float32 rows (its
  hybrid kernel), so each such GATHER becomes rows gathered, then scaled:
      RESHAPE(ids -> [-1]) -> EMBEDDING_LOOKUP(ids, int8 table, per-row scales) -> RESHAPE
  (the same output tensor, 1/4 of the table bytes, error at most half a step of its row's
  scale, max |row| / 127).
- Tables added to activations (a position table the converter folded out of its GATHER, a
  ViT's position embedding): int8 with one scale per position behind a DEQUANTIZE, as the
  converter stores weight-only weights.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from compressor.export.tflite import opcode_index


# Constant tables read by elementwise float ops (as export/onnx_weight_only.py's).
TABLE_ELEMENTS = 1024
TABLE_READERS = ("ADD", "SUB", "MUL", "CONCATENATION")
TABLE_MAX_ABS = 1e3   # larger magnitudes are masks and sentinels, not learned values


def int8_tables(content: bytes) -> bytes:
    """`content` with its float32 embedding tables and added constant tables stored int8 (see
    the module docstring); the file itself when there is none."""
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model_from_bytearray(bytearray(content))
    changed = False
    for graph in model.subgraphs:
        users = _tensor_users(graph)
        operators = []
        for op in graph.operators:
            table = _float_table(model, graph, op, users, schema, flatbuffer_utils)
            if table is None:
                operators.append(op)
                continue
            operators += _embedding_lookup(model, graph, op, table, schema)
            changed = True
        restores = _int8_added_tables(model, graph, schema, flatbuffer_utils)
        graph.operators = restores + operators
        changed = changed or bool(restores)
    if not changed:
        return content
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def _tensor_users(graph: Any) -> dict[int, int]:
    users: dict[int, int] = {}
    for op in graph.operators:
        for index in op.inputs:
            users[index] = users.get(index, 0) + 1
    return users


def _int8_added_tables(model: Any, graph: Any, schema: Any, flatbuffer_utils: Any) -> list:
    """DEQUANTIZE ops restoring each float32 constant table read only by float TABLE_READERS
    ops from its int8 copy (one scale per row of the last two axes)."""
    readers: dict[int, list[str]] = {}
    for op in graph.operators:
        name = flatbuffer_utils.opcode_to_name(model, op.opcodeIndex)
        floats = all(graph.tensors[o].type == schema.TensorType.FLOAT32 for o in op.outputs)
        for index in op.inputs:
            readers.setdefault(index, []).append(name if floats else "int")
    boundary = set(graph.inputs) | set(graph.outputs)
    restores = []
    for index, names in readers.items():
        tensor = graph.tensors[index] if index >= 0 else None
        if tensor is None or index in boundary or tensor.type != schema.TensorType.FLOAT32 \
                or any(name not in TABLE_READERS for name in names):
            continue
        data = model.buffers[tensor.buffer].data
        shape = list(tensor.shape)
        if data is None or sum(dim > 1 for dim in shape) < 2 or int(np.prod(shape)) < TABLE_ELEMENTS:
            continue
        values = np.frombuffer(bytes(bytearray(data)), dtype=np.float32).reshape(shape)
        if not np.all(np.isfinite(values)) or float(np.abs(values).max()) > TABLE_MAX_ABS:
            continue
        axis = len(shape) - 2
        quantized, scales = _per_row_int8(values, axis)
        stored = _tensor(model, graph, schema, tensor.name + b"_int8", shape,
                         schema.TensorType.INT8, quantized)
        graph.tensors[stored].quantization = _per_row(scales, axis, schema)
        tensor.buffer = 0                              # now computed by the DEQUANTIZE
        restores.append(_op(opcode_index(model, schema.BuiltinOperator.DEQUANTIZE, schema),
                            [stored], [index], schema))
    return restores


def _per_row_int8(values: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 in [-127, 127] with one scale per index of `axis` (1 for a zero row)."""
    others = tuple(i for i in range(values.ndim) if i != axis)
    scales = np.abs(values).max(axis=others) / 127.0
    scales[scales == 0] = 1.0
    shape = [1] * values.ndim
    shape[axis] = -1
    quantized = np.clip(np.round(values / scales.reshape(shape)), -127, 127).astype(np.int8)
    return quantized, scales.astype(np.float32)


def _per_row(scales: np.ndarray, axis: int, schema: Any) -> Any:
    params = schema.QuantizationParametersT()
    params.scale, params.zeroPoint = scales.tolist(), [0] * len(scales)
    params.quantizedDimension = axis
    return params


def _float_table(model: Any, graph: Any, op: Any, users: dict[int, int], schema: Any,
                 flatbuffer_utils: Any) -> np.ndarray | None:
    """The float32 table of a GATHER this rewrite applies to, else None."""
    if flatbuffer_utils.opcode_to_name(model, op.opcodeIndex) != "GATHER" or len(op.inputs) != 2:
        return None
    options = op.builtinOptions
    if options is not None and (options.axis != 0 or options.batchDims != 0):
        return None
    table, ids, output = (graph.tensors[i] for i in (*op.inputs, op.outputs[0]))
    data = model.buffers[table.buffer].data
    if (table.type != schema.TensorType.FLOAT32 or ids.type != schema.TensorType.INT32
            or data is None or len(table.shape) != 2 or users.get(op.inputs[0]) != 1
            or _output_shape(output) is None):
        return None
    return np.frombuffer(bytes(bytearray(data)), dtype=np.float32).reshape(table.shape)


def _output_shape(tensor: Any) -> list[int] | None:
    """The output shape for RESHAPE: -1 for (at most one) dynamic dimension."""
    shape = list(tensor.shapeSignature if tensor.shapeSignature is not None else tensor.shape)
    return shape if shape and sum(dim < 0 for dim in shape) <= 1 else None


def _embedding_lookup(model: Any, graph: Any, gather: Any, table: np.ndarray,
                      schema: Any) -> list:
    table_index, ids_index = gather.inputs
    output = gather.outputs[0]
    quantized, scales = _per_row_int8(table, 0)
    weights = graph.tensors[table_index]
    model.buffers[weights.buffer].data = np.frombuffer(quantized.tobytes(), dtype=np.uint8)
    weights.type = schema.TensorType.INT8
    weights.quantization = _per_row(scales, 0, schema)

    width = int(table.shape[1])
    flat_ids = _tensor(model, graph, schema, graph.tensors[ids_index].name + b"/flat",
                       [-1], schema.TensorType.INT32)
    rows = _tensor(model, graph, schema, graph.tensors[output].name + b"/rows",
                   [-1, width], schema.TensorType.FLOAT32)
    flat_shape = _tensor(model, graph, schema, b"flat_shape", [1], schema.TensorType.INT32,
                         np.array([-1], np.int32))
    out_shape = _output_shape(graph.tensors[output])
    back_shape = _tensor(model, graph, schema, graph.tensors[output].name + b"/shape",
                         [len(out_shape)], schema.TensorType.INT32, np.array(out_shape, np.int32))
    reshape = opcode_index(model, schema.BuiltinOperator.RESHAPE, schema)
    lookup = opcode_index(model, schema.BuiltinOperator.EMBEDDING_LOOKUP, schema)
    return [_op(reshape, [ids_index, flat_shape], [flat_ids], schema),
            _op(lookup, [flat_ids, table_index], [rows], schema),
            _op(reshape, [rows, back_shape], [output], schema)]


def _tensor(model: Any, graph: Any, schema: Any, name: bytes, shape: list[int], dtype: int,
            data: np.ndarray | None = None) -> int:
    tensor = schema.TensorT()
    tensor.name, tensor.type = name, dtype
    tensor.shape = [max(dim, 1) for dim in shape]
    tensor.shapeSignature = list(shape)
    tensor.buffer = 0                                 # buffer 0: empty (computed at run time)
    if data is not None:
        buffer = schema.BufferT()
        buffer.data = np.frombuffer(data.tobytes(), dtype=np.uint8)
        model.buffers.append(buffer)
        tensor.buffer = len(model.buffers) - 1
    graph.tensors.append(tensor)
    return len(graph.tensors) - 1


def _op(opcode: int, inputs: list[int], outputs: list[int], schema: Any) -> Any:
    op = schema.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = opcode, inputs, outputs
    return op

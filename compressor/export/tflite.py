"""TFLite flatbuffer work every exporter shares: float16 weight storage and op-level dtypes.

`float16_weights` stores chosen float32 conv / dense weights as float16 behind a DEQUANTIZE
op, the form the converter's own float16 models have, which LiteRT / XNNPACK load as float32.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from compressor.core.kernel_ops import TFLITE_KERNEL_INPUTS


# float16 files also store embedding tables (GATHER's params) as float16, as the converter does.
FLOAT16_WEIGHT_INPUTS = {**TFLITE_KERNEL_INPUTS, "GATHER": (0,)}


def float16_weights(content: bytes, chosen: Callable[[str], bool]) -> bytes:
    """Store the float32 weights of the conv / dense / gather ops `chosen(weight tensor name)`
    picks as float16, each behind a DEQUANTIZE op that restores float32 at load time; every
    other constant (biases, in-model preprocessing, norms) stays float32."""
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model_from_bytearray(bytearray(content))
    dequantize = opcode_index(model, schema.BuiltinOperator.DEQUANTIZE, schema)
    for graph in model.subgraphs:
        operators = []
        for op in graph.operators:
            name = flatbuffer_utils.opcode_to_name(model, op.opcodeIndex)
            for index in FLOAT16_WEIGHT_INPUTS.get(name, ()):
                if index < len(op.inputs) and chosen(graph.tensors[op.inputs[index]].name.decode()):
                    operators += _float16_weight(model, graph, op, index, dequantize, schema)
            operators.append(op)
        graph.operators = operators
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def float_kernel_ops(content: bytes) -> list[str]:
    """'OP (weight tensor)' for each conv / dense / matmul op that does not compute in int8:
    any of its inputs (weights through a DEQUANTIZE included) is a float tensor."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    interpreter = Interpreter(model_content=content, experimental_op_resolver_type=(
        OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES))
    tensors = {t["index"]: t for t in interpreter.get_tensor_details()}
    found = []
    for op in interpreter._get_ops_details():  # the only op listing LiteRT offers in Python
        weights = TFLITE_KERNEL_INPUTS.get(op["op_name"])
        inputs = [i for i in op["inputs"] if i >= 0]
        if weights is None:
            continue
        if any(np.issubdtype(tensors[i]["dtype"], np.floating) for i in inputs):
            weight = tensors[inputs[weights[0]]]["name"] if weights[0] < len(inputs) else "?"
            found.append(f"{op['op_name']} ({weight})")
    return found


def _float16_weight(model: Any, graph: Any, op: Any, index: int, dequantize: int,
                    schema: Any) -> list:
    weight = graph.tensors[op.inputs[index]]
    buffer = model.buffers[weight.buffer]
    if weight.type != schema.TensorType.FLOAT32 or buffer.data is None or not len(buffer.data):
        return []                             # not a float32 constant: nothing to store as fp16
    values = np.frombuffer(bytes(bytearray(buffer.data)), dtype=np.float32)
    half = schema.TensorT()
    half.name, half.shape, half.type = weight.name + b"_fp16", list(weight.shape), \
        schema.TensorType.FLOAT16
    stored = schema.BufferT()
    stored.data = np.frombuffer(values.astype(np.float16).tobytes(), dtype=np.uint8)
    model.buffers.append(stored)
    half.buffer = len(model.buffers) - 1
    graph.tensors.append(half)
    if sum(t.buffer == weight.buffer for g in model.subgraphs for t in g.tensors) == 1:
        buffer.data = None                    # the float32 copy is no longer stored
    weight.buffer = 0                         # now computed by the DEQUANTIZE (buffer 0 = empty)
    restore = schema.OperatorT()
    restore.opcodeIndex, restore.inputs, restore.outputs = dequantize, [len(graph.tensors) - 1], \
        [op.inputs[index]]
    return [restore]


def opcode_index(model: Any, builtin: int, schema: Any) -> int:
    """The index of `builtin` in the model's operator codes, added when it has none (every
    TFLite rewrite here: export/tflite_tables.py, backends/llm/litert_weights.py)."""
    for index, code in enumerate(model.operatorCodes):
        if max(code.builtinCode, code.deprecatedBuiltinCode) == builtin:
            return index
    code = schema.OperatorCodeT()
    code.builtinCode, code.deprecatedBuiltinCode, code.version = builtin, min(builtin, 127), 1
    model.operatorCodes.append(code)
    return len(model.operatorCodes) - 1


def renamed_signature(content: bytes, names: dict[str, str]) -> bytes:
    """The model with its serving signature's entries renamed (old -> new): converters name
    them `args_0`, `output_0`, `quant_dense`, ..., which a user's data and `validate.output`
    cannot refer to."""
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model_from_bytearray(bytearray(content))
    if len(model.signatureDefs or []) != 1:
        return content
    signature = model.signatureDefs[0]
    for entry in (*signature.inputs, *signature.outputs):
        old = entry.name.decode() if isinstance(entry.name, bytes) else entry.name
        entry.name = names.get(old, old).encode()
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def signature_names(content: bytes) -> dict[str, str]:
    """Tensor name -> serving-signature name of every input and output (`serving_default_x:0`
    -> `x`), for converters that name graph I/O after the tensors."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=content)
    signatures = interpreter._get_full_signature_list() or {}
    if len(signatures) != 1:
        return {}
    tensor_names = {d["index"]: d["name"] for d in interpreter.get_tensor_details()}
    signature = next(iter(signatures.values()))
    return {tensor_names[index]: name for side in ("inputs", "outputs")
            for name, index in signature[side].items() if index in tensor_names}


POST_TRAINING_RECIPES = {"dynamic": "dynamic_wi8_afp32", "weight_only": "weight_only_wi8_afp32"}


def int8_weights(content: bytes, mode: str) -> bytes:
    """A float TFLite with int8 weights (per channel) by ai-edge-quantizer: `dynamic`
    quantizes activations at run time, `weight_only` keeps float compute (a DEQUANTIZE per
    weight). Covers FULLY_CONNECTED / CONV / BATCH_MATMUL / EMBEDDING_LOOKUP / GATHER weights,
    so embedding tables and unrolled recurrent kernels are int8 too."""
    from ai_edge_quantizer import quantizer, recipe

    from compressor.core.quiet import muted_native_output

    engine = quantizer.Quantizer(bytearray(content))
    engine.load_quantization_recipe(getattr(recipe, POST_TRAINING_RECIPES[mode])())
    with muted_native_output():   # it prints a size summary on stdout
        return bytes(engine.quantize().quantized_model)

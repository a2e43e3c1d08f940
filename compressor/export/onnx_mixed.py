"""Layers kept at a higher precision inside a lower-precision ONNX model.

`restore_float32_weights`: onnxconverter-common computes the float16 conversion's blocked
nodes in float32, but stores their weights as float16 behind Casts; precision `exclude`
promises float32, so those weights are put back as they were.

`keep_float_kernels`: the quantize fallback's float layers inside an int8 (QDQ) model.
Two fixes on the converted graph:
- float16 storage: converters fold float16 weights back into float32 constants; the weights
  of float kernels are stored as float16 again, behind a Cast to float32.
- onnxruntime (1.32, any optimization level above "disabled") re-quantizes a float MatMul
  / Gemm whose input comes from DequantizeLinear and whose output goes to QuantizeLinear: it
  treats the float weight as one it should quantize, per tensor, which undoes the fallback
  (seen: accuracy 0.94 -> 0.08). Feeding the float layer the float activation from before
  the QuantizeLinear -> DequantizeLinear pair avoids that pattern and skips one needless
  rounding; the graph otherwise stays as converted.
"""
from __future__ import annotations

from typing import Any

from compressor.core.kernel_ops import ONNX_KERNEL_INPUTS

LAYOUT_OPS = ("Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze")


def float_kernel_nodes(proto: Any) -> list[Any]:
    """Conv / MatMul / Gemm nodes whose weight is a float32 or float16 constant (not int8 + DQ)."""
    import onnx

    initializers = {init.name: init for init in proto.graph.initializer}
    producers = {out: node for node in proto.graph.node for out in node.output}
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
    found = []
    for node in proto.graph.node:
        for index in ONNX_KERNEL_INPUTS.get(node.op_type, ()):
            weight = node.input[index] if index < len(node.input) else ""
            while weight in producers and producers[weight].op_type in ("Cast", "Transpose"):
                weight = producers[weight].input[0]
            if weight in initializers and initializers[weight].data_type in floats:
                found.append(node)
                break
    return found


def keep_float_kernels(proto: Any, dtype: str) -> None:
    """Apply both fixes (see the module doc) to every float kernel of `proto`, in place."""
    for node in float_kernel_nodes(proto):
        _feed_float_activation(proto, node)
        if dtype == "float16":
            _store_weight_float16(proto, node)
    drop_unused(proto)


def restore_float32_weights(proto: Any, originals: dict[str, Any], blocked: set[str]) -> None:
    """Feed `blocked` nodes their original float32 initializers instead of float16 copies cast
    back to float32, wherever no float16 node shares the initializer."""
    graph = proto.graph
    producers = {out: node for node in graph.node for out in node.output}
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    restored = set()
    for node in [n for n in graph.node if n.name in blocked]:
        for position, name in enumerate(node.input):
            cast = producers.get(name)
            if cast is None or cast.op_type != "Cast" or cast.input[0] not in originals:
                continue
            source = cast.input[0]
            shared = any(reader.op_type != "Cast" or any(
                consumer.name not in blocked for consumer in readers.get(reader.output[0], []))
                for reader in readers[source])
            if not shared:
                node.input[position] = source
                restored.add(source)
    for init in [init for init in graph.initializer if init.name in restored]:
        graph.initializer.remove(init)
        graph.initializer.append(originals[init.name])
    drop_unused(proto)


def _feed_float_activation(proto: Any, node: Any) -> None:
    """Bypass the QuantizeLinear -> DequantizeLinear pair on `node`'s activation input, looking
    through layout-only ops (which work on float as on int8)."""
    producers = {out: n for n in proto.graph.node for out in n.output}
    consumer, position = node, 0
    while True:
        source = producers.get(consumer.input[position])
        if source is None:
            return
        if source.op_type == "DequantizeLinear":
            quantize = producers.get(source.input[0])
            if quantize is not None and quantize.op_type == "QuantizeLinear":
                consumer.input[position] = quantize.input[0]
            return
        if source.op_type not in LAYOUT_OPS:
            return
        consumer, position = source, 0


def _store_weight_float16(proto: Any, node: Any) -> None:
    import numpy as np
    import onnx
    from onnx import numpy_helper

    initializers = {init.name: init for init in proto.graph.initializer}
    names = [node.input[i] for i in ONNX_KERNEL_INPUTS[node.op_type] if i < len(node.input)]
    name = next((n for n in names if n in initializers), "")
    weight = initializers.get(name)
    if weight is None or weight.data_type != onnx.TensorProto.FLOAT:
        return
    values = numpy_helper.to_array(weight).astype(np.float16)
    proto.graph.initializer.remove(weight)
    proto.graph.initializer.append(numpy_helper.from_array(values, f"{name}_fp16"))
    cast = onnx.helper.make_node("Cast", [f"{name}_fp16"], [name], name=f"{name}_to_float32",
                                 to=onnx.TensorProto.FLOAT)
    # Keep the graph topologically sorted: the Cast goes right before its first consumer.
    nodes = proto.graph.node
    first = next(i for i, n in enumerate(nodes) if name in n.input)
    nodes.insert(first, cast)


def drop_unused(proto: Any) -> None:
    """Remove nodes and initializers nothing reads any more (the bypassed Q / DQ pairs)."""
    graph = proto.graph
    outputs = {value.name for value in graph.output}
    changed = True
    while changed:
        used = {name for node in graph.node for name in node.input} | outputs
        dead = [node for node in graph.node if not any(out in used for out in node.output)]
        for node in dead:
            graph.node.remove(node)
        changed = bool(dead)
    used = {name for node in graph.node for name in node.input} | outputs
    for init in [init for init in graph.initializer if init.name not in used]:
        graph.initializer.remove(init)

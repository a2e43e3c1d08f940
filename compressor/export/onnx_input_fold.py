"""In-model input preprocessing folded into the first convolutions, before quantizing.

keras.applications nets (and many others) start with Rescaling / Normalization: constant
Mul / Add / Sub / Div on the raw input, then a Conv. Fed data scaled differently from what
the preprocessing expects (images in [0, 1] into a model that rescales [0, 255]), the conv
input is a narrow band far from zero, e.g. [-2.118, -2.101]: uint8 must cover zero as well,
so the band gets about 2 of 256 levels, and 7-bit weight rounding times that large offset
swamps the signal. Measured (EfficientNetV2B0, 64x64, [0, 1] data): int8 ONNX 0.127
accuracy vs 0.963 float.

The preprocessing is affine per channel, y = a*x + b, so conv(y) = conv'(x) + conv(b):
conv' has the weights scaled by a per input channel; conv(b) is a constant, the bias plus,
with zero padding, a map that differs at the borders (the padded zeros of y are -b/a in x),
added after the conv. The raw input is then what int8 quantizes: well spread, zero included.
Exact in float; checked on a sample and left unfolded where it does not hold. The int8 route
folds only where the sample shows the narrow band (`narrow`): on well-spread inputs the
border map's extra rounding costs a little fidelity instead.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from compressor.export.input_band import channel_constants, narrow_span

AFFINE_OPS = ("Mul", "Add", "Sub", "Div")
LAYOUT_OPS = ("Transpose",)
TOLERANCE = 1e-4   # max |folded - original| over the conv outputs, relative to their max |value|


def fold_input_affine(proto: Any, sample: dict[str, np.ndarray] | None = None,
                      narrow: float | None = None) -> list[str]:
    """Fold each float input's constant affine chain into the convs that read it, in place;
    `sample`: input name -> a batch to check the fold on (without one, uniform noise: the
    fold is algebra, any input checks it); `narrow`: fold only where the sample's typical
    channel spans less than this fraction of the range its tensor must cover
    (input_band.narrow_span).
    Returns the folded conv names."""
    import onnx

    from compressor.export.onnx_mixed import drop_unused

    folded = []
    for value in proto.graph.input:
        tensor = value.type.tensor_type
        dims = [dim.dim_value if dim.HasField("dim_value") else 0 for dim in tensor.shape.dim]
        # the border map is sized for one image size: non-batch dims must be fixed
        if tensor.elem_type != onnx.TensorProto.FLOAT or len(dims) != 4 or 0 in dims[1:]:
            continue
        chain = _chain(proto, value.name)
        if chain is not None:
            batch = (sample or {}).get(value.name)
            if batch is None:
                batch = np.random.default_rng(0).random((2, *dims[1:]), dtype=np.float32)
            folded += _fold(proto, value.name, *chain, batch, narrow)
    if folded:
        drop_unused(proto)   # the replaced weights and the chain's constants
    return folded


def fold_input_affine_file(path: Path, sample: dict[str, np.ndarray],
                           narrow: float | None = None) -> list[str]:
    """`fold_input_affine` on the ONNX file at `path`, saved back when something folded."""
    import onnx

    proto = onnx.load(str(path))
    folded = fold_input_affine(proto, sample, narrow)
    if folded:
        onnx.save(proto, str(path))
    return folded


def _chain(proto: Any, name: str) -> tuple[list[Any], list[Any]] | None:
    """(chain nodes, consuming convs) from input `name`: constant affine ops (at least one)
    and transposes, each the only reader of its input, ending where only Convs with constant
    weights read the result."""
    constants = {init.name for init in proto.graph.initializer}
    readers: dict[str, list[Any]] = {}
    for node in proto.graph.node:
        for tensor in node.input:
            readers.setdefault(tensor, []).append(node)
    outputs = {value.name for value in proto.graph.output}
    chain, tensor = [], name
    while len(readers.get(tensor, [])) == 1 and tensor not in outputs:
        node = readers[tensor][0]
        others = [t for t in node.input if t != tensor]
        if node.op_type in LAYOUT_OPS or (
                node.op_type in AFFINE_OPS and len(others) == 1 and others[0] in constants
                and not (node.op_type == "Div" and node.input[0] != tensor)):
            chain.append(node)
            tensor = node.output[0]
        else:
            break
    convs = readers.get(tensor, [])
    if (not any(node.op_type in AFFINE_OPS for node in chain) or tensor in outputs or not convs
            or any(node.op_type != "Conv" or node.input[0] != tensor
                   or node.input[1] not in constants for node in convs)):
        return None
    return chain, convs


def _fold(proto: Any, name: str, chain: list[Any], convs: list[Any], sample: np.ndarray,
          narrow: float | None) -> list[str]:
    from onnx import numpy_helper

    if narrow is not None and narrow_span(
            _run(proto, chain, name, sample.astype(np.float32), chain[-1].output[0])) >= narrow:
        return []
    one = sample[:1].astype(np.float32)
    offset = _run(proto, chain, name, np.zeros_like(one), chain[-1].output[0])
    scale = _run(proto, chain, name, np.ones_like(one), chain[-1].output[0]) - offset
    a, b = _per_channel(scale), _per_channel(offset)
    if a is None or b is None or not np.all(np.isfinite(a)) or np.any(a == 0):
        return []
    outputs = [conv.output[0] for conv in convs]
    before = [_run(proto, [*chain, conv], name, sample, conv.output[0]) for conv in convs]
    original = proto.SerializeToString()
    initializers = {init.name: numpy_helper.to_array(init) for init in proto.graph.initializer}
    # nodes are told apart by their first output (unique in an ONNX graph)
    layout = {node.output[0] for node in chain if node.op_type in LAYOUT_OPS}
    dropped = {node.output[0] for node in chain} - layout
    folding = set(outputs)
    feed, nodes = name, []
    for node in list(proto.graph.node):
        if node.output[0] in dropped:
            continue
        if node.output[0] in layout:      # a transpose, now of the raw input: renamed so
            node.input[0] = feed           # the old name never holds other values
            node.output[0] = feed = f"{node.output[0]}/raw_input"
        folds = node.output[0] in folding
        nodes.append(node)
        if folds:
            nodes += _fold_conv(proto, node, feed, a, b, offset.shape, initializers)
    kept = [type(node)() for node in nodes]
    for copy, node in zip(kept, nodes):
        copy.CopyFrom(node)
    del proto.graph.node[:]
    proto.graph.node.extend(kept)
    if not all(_close(_run(proto, _upstream(proto, out), name, sample, out), want)
               for out, want in zip(outputs, before)):
        proto.ParseFromString(original)
        return []
    return [conv.name for conv in convs]


def _fold_conv(proto: Any, conv: Any, feed: str, a: np.ndarray, b: np.ndarray,
               input_shape: tuple[int, ...], initializers: dict[str, np.ndarray]) -> list[Any]:
    """conv(a*x + b) -> conv'(x) + bias, in place; returns the Add of the border map (zero
    padding: border outputs saw padded zeros of y, not of x), if there is one."""
    from onnx import helper, numpy_helper

    weight = initializers[conv.input[1]].astype(np.float64)
    group = next((attr.i for attr in conv.attribute if attr.name == "group"), 1)
    per_group = weight.shape[1]
    channel = np.arange(weight.shape[0]) // (weight.shape[0] // group)
    inputs = channel[:, None] * per_group + np.arange(per_group)[None, :]   # (out, in) -> x channel
    spatial = (slice(None), slice(None)) + (None,) * (weight.ndim - 2)
    constant = (weight * b[inputs][spatial]).sum(axis=tuple(range(1, weight.ndim)))
    bias = (initializers[conv.input[2]].astype(np.float64)
            if len(conv.input) > 2 and conv.input[2] else np.zeros(weight.shape[0]))
    border = _border_map(proto, conv, weight, b, input_shape) - constant[:, None, None]
    prefix = f"{conv.output[0]}/folded_input"   # output names are unique, node names need not be
    proto.graph.initializer.extend([
        numpy_helper.from_array((weight * a[inputs][spatial]).astype(np.float32),
                                f"{prefix}/weight"),
        numpy_helper.from_array((bias + constant).astype(np.float32), f"{prefix}/bias")])
    conv.input[0], conv.input[1] = feed, f"{prefix}/weight"
    if len(conv.input) > 2:
        conv.input[2] = f"{prefix}/bias"
    else:
        conv.input.append(f"{prefix}/bias")
    if np.abs(border).max() <= 1e-6 * max(np.abs(constant).max(), 1e-12):
        return []
    output, conv.output[0] = conv.output[0], f"{prefix}/conv"
    proto.graph.initializer.append(
        numpy_helper.from_array(border[None].astype(np.float32), f"{prefix}/border"))
    return [helper.make_node("Add", [conv.output[0], f"{prefix}/border"], [output],
                             name=f"{prefix}/add")]


def _border_map(proto: Any, conv: Any, weight: np.ndarray, b: np.ndarray,
                input_shape: tuple[int, ...]) -> np.ndarray:
    """The conv (no bias) of a constant image holding b per channel: (out, H', W')."""
    from onnx import helper

    plain = helper.make_node("Conv", ["image", "weight"], ["map"], name="border")
    plain.attribute.extend(conv.attribute)
    image = np.broadcast_to(b[None, :, None, None], (1, len(b), *input_shape[2:]))
    return _run(proto, [plain], "image", image.astype(np.float32), "map",
                {"weight": weight.astype(np.float32)})[0]


def _per_channel(values: np.ndarray) -> np.ndarray | None:
    """values (1, C, H, W) -> (C,) where every channel holds one value, else None."""
    return channel_constants(values[0], 0) if values.ndim == 4 else None


def _run(proto: Any, nodes: list[Any], name: str, x: np.ndarray, output: str,
         extra: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """`output` of `nodes` (with the initializers they read) fed `x` as input `name`."""
    import onnx
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    used = {tensor for node in nodes for tensor in node.input}
    inits = [init for init in proto.graph.initializer if init.name in used]
    inits += [numpy_helper.from_array(value, key) for key, value in (extra or {}).items()]
    graph = helper.make_graph(
        nodes, "fold-check", [helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info(output, onnx.TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=proto.opset_import)
    model.ir_version = proto.ir_version
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {name: x})[0]


def _upstream(proto: Any, output: str) -> list[Any]:
    """The nodes that compute `output`, in graph order."""
    producers = {out: node for node in proto.graph.node for out in node.output}
    wanted, stack = set(), [output]
    while stack:
        node = producers.get(stack.pop())
        if node is not None and node.output[0] not in wanted:
            wanted.add(node.output[0])
            stack.extend(node.input)
    return [node for node in proto.graph.node if node.output[0] in wanted]


def _close(got: np.ndarray, want: np.ndarray) -> bool:
    return bool(np.abs(got - want).max() <= TOLERANCE * max(np.abs(want).max(), 1e-12))

"""What every onnxruntime quantization route does first: shape inference and graph
optimization (quant_pre_process), and one typed error for a quantizer that gives up."""
from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compressor.errors import BackendUnavailableError, first_line


def preprocessed(source: Path, target: Path) -> Path:
    """quant_pre_process: symbolic + ONNX shape inference and onnxruntime's basic graph
    optimizations (BatchNorm folded into its conv, constants folded). Symbolic shape
    inference asserts on some ops (e.g. an LSTM with an unused output) or gives up with a bare
    Exception ("Incomplete symbolic shape inference"); ONNX's own shape inference is then
    enough for quantization."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    source, target = Path(source).resolve(), Path(target).resolve()
    # Symbolic shape inference that gives up leaves sym_shape_infer_temp.onnx and *.data files
    # in the current directory: run it where the target goes (a folder that is removed).
    with contextlib.chdir(target.parent):
        try:
            quant_pre_process(str(source), str(target))
        except Exception:   # noqa: BLE001 - onnxruntime raises bare Exception here; retried below
            quantizing(lambda: quant_pre_process(str(source), str(target),
                                                 skip_symbolic_shape=True), "pre-processing")
    global_average_pools(target)
    return target


def global_average_pools(path: Path) -> None:
    """ReduceMean over the spatial axes of a 4-D tensor (how PyTorch's AdaptiveAvgPool2d(1) and
    tf2onnx's global pooling arrive) -> GlobalAveragePool (+ Flatten without keepdims), in
    place: onnxruntime's quantizer leaves ReduceMean float, between a DequantizeLinear and a
    QuantizeLinear; GlobalAveragePool runs as QLinearGlobalAveragePool. Measured: those
    ReduceMean + Q/DQ took ~15% of an EfficientNet-style net's int8 time."""
    import onnx
    from onnx import helper, numpy_helper

    proto = onnx.load(str(path))
    graph = proto.graph
    constants = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    ranks = {value.name: len(value.type.tensor_type.shape.dim)
             for value in list(graph.value_info) + list(graph.input)}
    changed = False
    for node in list(graph.node):
        if node.op_type != "ReduceMean" or ranks.get(node.input[0]) != 4:
            continue
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        axes = attributes.get("axes")
        if axes is None and len(node.input) > 1:
            axes = constants.get(node.input[1])
        if axes is None or sorted(int(a) % 4 for a in axes) != [2, 3]:
            continue
        keep = attributes.get("keepdims", 1)
        pooled = node.output[0] if keep else f"{node.output[0]}_pooled"
        new = [helper.make_node("GlobalAveragePool", [node.input[0]], [pooled], name=node.name)]
        if not keep:
            new.append(helper.make_node("Flatten", [pooled], [node.output[0]], axis=1,
                                        name=f"{node.name}_flatten"))
        index = list(graph.node).index(node)
        graph.node.remove(node)
        for offset, replacement in enumerate(new):
            graph.node.insert(index + offset, replacement)
        changed = True
    if changed:
        onnx.save(proto, str(path))


def quantizing(run: Any, kind: str) -> None:
    try:
        run()
    except (RuntimeError, ValueError, KeyError, TypeError, AssertionError, IndexError) as exc:
        # onnxruntime's pybind errors subclass RuntimeError; its quantizers raise ValueError
        # or assert on graphs they cannot handle.
        raise BackendUnavailableError(
            f"onnxruntime int8 {kind} quantization failed: {first_line(exc)}; an op its "
            "quantizer does not handle is the usual cause: keep that layer float (precision "
            "exclude / quantize fallback: auto), or export tflite only") from None


def prepared_names(prepared: Path, names: Sequence[str]) -> list[str]:
    """`names` (nodes of the original file) as they are called in the pre-processed one:
    onnxruntime names a fused node after the first node it fused, plus a suffix
    ('dense/MatMul' + Add -> Gemm 'dense/MatMul/MatMulAddFusion')."""
    import onnx

    wanted = set(names)
    if not wanted:
        return []
    graph = onnx.load(str(prepared), load_external_data=False).graph
    return [node.name for node in graph.node
            if node.name in wanted or node.name.rsplit("/", 1)[0] in wanted]

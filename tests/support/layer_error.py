"""Where error enters an int8 QDQ ONNX file: every activation it quantizes, read back from the
file in onnxruntime, against the same tensor of the float model it was quantized from.

Each QuantizeLinear output (uint8) becomes a graph output; onnxruntime still fuses the groups
around it into its int8 kernels (the final outputs are checked to stay bit-identical), so the
values are the ones the int8 kernels computed. Error = RMS(dequantized - float) / std(float):
a tensor riding on a large offset shows its loss against its signal, not its magnitude.
(LiteRT: `Interpreter(..., experimental_preserve_all_tensors=True)` keeps intermediates the same
way; tensor names there are the converter's.)"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper


def _outputs(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [value.name for value in session.get_outputs()]
    return dict(zip(names, session.run(None, feed)))


def layer_errors(float_path: Path, int8_path: Path,
                 feed: dict[str, np.ndarray]) -> dict[str, float]:
    """Float tensor name -> error of its int8 version, in graph order (tensors the float
    model does not have, e.g. ones a graph edit renamed, are left out)."""
    quantized, reference = onnx.load(str(int8_path)), onnx.load(str(float_path))
    constants = {init.name: numpy_helper.to_array(init) for init in quantized.graph.initializer}
    final = [value.name for value in quantized.graph.output]
    before = _outputs(quantized, feed)
    points = [node for node in quantized.graph.node
              if node.op_type == "QuantizeLinear" and node.input[0] not in constants]
    float_names = {out for node in reference.graph.node for out in node.output}
    points = [node for node in points if node.input[0] in float_names]
    for node in points:
        quantized.graph.output.append(
            helper.make_tensor_value_info(node.output[0], onnx.TensorProto.UINT8, None))
        reference.graph.output.append(
            helper.make_tensor_value_info(node.input[0], onnx.TensorProto.FLOAT, None))
    got, want = _outputs(quantized, feed), _outputs(reference, feed)
    assert all(np.array_equal(before[name], got[name]) for name in final)
    errors = {}
    for node in points:
        scale, zero = (constants[name].astype(np.float64) for name in node.input[1:3])
        value = (got[node.output[0]].astype(np.float64) - zero) * scale
        exact = want[node.input[0]].astype(np.float64)
        errors[node.input[0]] = float(np.sqrt(np.mean((value - exact) ** 2)) / (exact.std() + 1e-12))
    return errors

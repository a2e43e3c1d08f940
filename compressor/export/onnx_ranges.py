"""Activation ranges a QAT model learned, carried into onnxruntime's static int8 quantizer.

The int8 ONNX of a QAT model is its float graph with the trained weights, quantized by
onnxruntime (export/onnx_quant.py). Calibrating the activation ranges anew throws away what QAT
trained the weights for: a net that QAT made work at its own ranges can fall apart at others
(keras.applications MobileNetV3Small fed [0, 1] images, int8_qat: TFLite, which keeps the
learned ranges, 1.0; ONNX recalibrated 0.21). Here each learned range is attached to the ONNX
tensor that holds the same values: names differ between the framework and the converter's
graph (and change again in onnxruntime's pre-processing), values do not. The framework gives,
per range, the tensor's value on a few inputs; the ONNX tensor equal to it (in the same layout
or channels-first) gets the range as an `rmin` / `rmax` override. Tensors no range matches are
calibrated as before.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MATCH_ROWS = 8          # inputs the values are compared on
MATCH_TOLERANCE = 1e-4  # max |difference| relative to the tensor's max |value|


@dataclass(frozen=True)
class LearnedRange:
    """A range learned for one tensor, and that tensor's value on the `LearnedRanges` inputs
    (framework layout, e.g. channels-last)."""
    value: np.ndarray
    low: float
    high: float


@dataclass(frozen=True)
class LearnedRanges:
    inputs: dict[str, np.ndarray]       # ONNX input name -> MATCH_ROWS rows
    ranges: tuple[LearnedRange, ...]


def range_overrides(model_path: Path, learned: LearnedRanges) -> dict[str, list[dict]]:
    """onnxruntime TensorQuantOverrides: ONNX tensor name -> [{"rmin", "rmax"}] for each float
    tensor of the model at `model_path` whose values on `learned.inputs` equal a learned
    range's tensor."""
    values = _float_tensors(model_path, learned.inputs)
    by_shape: dict[tuple[int, ...], list[str]] = {}
    for name, value in values.items():
        by_shape.setdefault(value.shape, []).append(name)
    overrides = {}
    for known in learned.ranges:
        for layout in _layouts(known.value):
            for name in by_shape.get(layout.shape, []):
                if _same(values[name], layout):
                    overrides[name] = [{"rmin": np.float32(min(known.low, 0.0)),
                                        "rmax": np.float32(max(known.high, 0.0))}]
    return overrides


def _float_tensors(model_path: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every float tensor the graph computes (its inputs included), on `inputs`."""
    import onnx
    import onnxruntime as ort

    proto = onnx.load(str(model_path))
    graph = proto.graph
    declared = {value.name for value in graph.output}
    computed = {name for node in graph.node for name in node.output} | set(inputs)
    float_names = [value.name for value in (*graph.input, *graph.value_info)
                   if value.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
                   and value.name in computed and value.name not in declared]
    graph.output.extend(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
                        for name in float_names if name not in inputs)
    session = ort.InferenceSession(proto.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    values = dict(zip(names, session.run(names, inputs)))
    values.update({name: array for name, array in inputs.items() if name in float_names})
    return values


def _layouts(value: np.ndarray) -> list[np.ndarray]:
    """The tensor as the framework holds it, and channels-first (tf2onnx's NCHW graph)."""
    if value.ndim == 4:
        return [value, value.transpose(0, 3, 1, 2)]
    if value.ndim == 3:
        return [value, value.transpose(0, 2, 1)]
    return [value]


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    scale = float(np.abs(want).max())
    return scale > 0 and float(np.abs(got - want).max()) <= MATCH_TOLERANCE * scale


def closest_to_float(float_path: Path, candidates: Sequence[Path],
                     batches: Sequence[dict[str, np.ndarray]]) -> Path:
    """The candidate (an int8 file of `float_path`) with the smallest output error: RMS of
    (candidate - float) over RMS of float, every output, every batch."""
    import onnxruntime as ort

    def outputs(path: Path) -> list[np.ndarray]:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [value.name for value in session.get_inputs()]
        return [out for batch in batches
                for out in session.run(None, {name: batch[name] for name in names})]

    reference = outputs(float_path)
    power = sum(float(np.sum(np.square(ref, dtype=np.float64))) for ref in reference)

    def error(path: Path) -> float:
        diff = sum(float(np.sum(np.square(got.astype(np.float64) - ref)))
                   for got, ref in zip(outputs(path), reference))
        return diff / max(power, 1e-30)

    return min(candidates, key=error)

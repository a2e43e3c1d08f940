"""What an artifact's read-back weights say: the share of weight bytes at a bit width (the
gate's check that a converter did not leave an int8 / int4 file float) and its largest tensors
(report.json `largest_tensors`, report.html's chart)."""
from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from compressor.core.tensor_names import short_tensor_name

# what converters append to a constant's name (tf2onnx, onnxruntime's quantizers): not the layer
CONVERTER_SUFFIX = re.compile(r"((/ReadVariableOp)?(:\d+)?(_DequantizeLinear|_to_float\d*|"
                              r"_quantized|_scale|_zero_point|_fp16))+$")
TOP = 20
ITEMSIZE = {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "uint32": 4, "float16": 2,
            "bfloat16": 2, "int16": 2, "uint16": 2, "int8": 1, "uint8": 1, "bool": 1,
            "int4": 0.5, "uint4": 0.5}


MIN_WEIGHT_SHARE = 0.9        # below it an integer artifact fails the gate
MATRIX_ELEMENTS = 1024        # weights this large are matrices / tables quantization must cover
PACKED_DTYPE_BITS = {"int4": 4, "uint4": 4}   # stored two to a byte; numpy has no such dtype


def dtype_bits(dtype: str) -> int:
    """Bits per stored element of a dtype name as artifact inspection reports it."""
    return PACKED_DTYPE_BITS.get(dtype) or np.dtype(dtype).itemsize * 8


def weight_share_at(weights, bits: int) -> tuple[float, list[str]]:
    """The fraction of the weight bytes in an artifact's matrices and tables (tensors of
    >= 1024 elements: kernels, embedding tables, recurrent weights; biases, norms, scales and
    small position tables stay float by design) stored at `bits` bits per element (int4
    packed two to a byte counts as 4), and its largest float tensors ("name (dtype, KB)"),
    which the gate names when the share is too low."""
    sizes = [(w, w.size * dtype_bits(w.dtype) / 8) for w in weights
             if w.size >= MATRIX_ELEMENTS]
    total = sum(size for _, size in sizes)
    if not total:
        return 1.0, []
    at_bits = sum(size for w, size in sizes if dtype_bits(w.dtype) == bits
                  and w.dtype.startswith(("int", "uint")))
    floats = sorted(((size, w) for w, size in sizes if w.dtype.startswith(("float", "bfloat"))),
                    key=lambda pair: -pair[0])
    return at_bits / total, [f"{short_tensor_name(w.name, getattr(w, 'reader', ''))} "
                             f"({w.dtype}, {size / 1024:.1f} KB)" for size, w in floats[:3]]


def int8_weight_share(weights) -> tuple[float, list[str]]:
    """`weight_share_at(weights, 8)`: the int8 share report.json has always carried."""
    return weight_share_at(weights, 8)


def largest_tensors(weights: Sequence[Any]) -> list[dict[str, Any]]:
    """report.json `largest_tensors`: the TOP biggest of an artifact's WeightTensors as
    {name (its layer), dtype, shape, bytes as stored}."""
    rows = [{"name": layer_label(w.name, w.reader), "dtype": w.dtype, "shape": list(w.shape),
             "bytes": int(w.size * ITEMSIZE.get(w.dtype, 4))} for w in weights]
    return sorted(rows, key=lambda row: -row["bytes"])[:TOP]


def layer_label(name: str, reader: str) -> str:
    """The layer a tensor belongs to ("hidden", "conv_b"), converter suffixes dropped."""
    label = short_tensor_name(CONVERTER_SUFFIX.sub("", name), CONVERTER_SUFFIX.sub("", reader))
    return label.split(" in ", 1)[1] if " in " in label else label

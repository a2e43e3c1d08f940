"""report.html's "largest tensors" chart: the 20 biggest constant tensors of each artifact, in
bytes as stored, coloured by dtype.

Each report.json row has `largest_tensors` (validation's inspection of the file, made here by
largest_tensors()). For a report.json without them (older runs re-rendered by `compress
report`) the files in the run's folder are read back with the same inspect code `compress
inspect` uses; folders and files over MAX_INSPECT_BYTES are not: the chart is left out.
"""
from __future__ import annotations

import re
from html import escape
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compressor.errors import CompressorError
from compressor.report.html import para, section
from compressor.report.html.charts import BarRow, Segment, bar_chart, dtype_colour, legend
from compressor.tasks.lm.report import human_size
from compressor.core.tensor_names import short_tensor_name

# what converters append to a constant's name (tf2onnx, onnxruntime's quantizers): not the layer
CONVERTER_SUFFIX = re.compile(r"((/ReadVariableOp)?(:\d+)?(_DequantizeLinear|_to_float\d*|"
                              r"_quantized|_scale|_zero_point|_fp16))+$")
TOP = 20
MAX_INSPECT_BYTES = 64 << 20          # re-reading a big file would slow every report
ITEMSIZE = {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "uint32": 4, "float16": 2,
            "bfloat16": 2, "int16": 2, "uint16": 2, "int8": 1, "uint8": 1, "bool": 1,
            "int4": 0.5, "uint4": 0.5}


def tensors_section(report: dict[str, Any], folder: Path | None) -> str:
    parts = []
    for art in report["artifacts"]:
        tensors = art.get("largest_tensors") or read_largest(folder, art["path"])
        if not tensors:
            continue
        rows = [BarRow(t["name"], [Segment(t["bytes"], dtype_colour(t["dtype"]),
                                           f"{t['name']}: {t['dtype']} {t['shape']}, "
                                           f"{human_size(t['bytes'])}")],
                       f"{human_size(t['bytes'])} {t['dtype']} "
                       + "x".join(str(d) for d in t["shape"])) for t in tensors]
        dtypes = dict.fromkeys(t["dtype"] for t in tensors)
        parts += [f'<h3 data-tensors="{escape(art["path"])}">{escape(art["path"])}</h3>',
                  bar_chart(rows, label=f"largest tensors of {art['path']}", fmt=human_size),
                  legend([(dtype_colour(d), d) for d in dtypes])]
    if not parts:
        return ""
    return section("tensors", f"Largest tensors (top {TOP}, bytes as stored)", *parts,
                   para("Read back from the artifact files; hover a bar for its shape. Names are "
                        "the layer each tensor belongs to.",
                        "note"))


def read_largest(folder: Path | None, relative: str) -> list[dict[str, Any]]:
    """The TOP largest constant tensors of folder/relative, [] where it cannot be read."""
    if folder is None:
        return []
    path = Path(folder) / relative
    # model.onnx's external data (model.onnx.data, model.onnx_data) counts too
    if not path.is_file() or sum(p.stat().st_size for p in path.parent.glob(f"{path.name}*")
                                 if p.is_file()) > MAX_INSPECT_BYTES:
        return []
    try:
        from compressor.runtimes import inspect_artifact

        weights = inspect_artifact(path).weights
    except (CompressorError, ImportError, OSError, ValueError):   # a runtime not installed,
        return []                                                  # a file that changed
    return largest_tensors(weights)


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

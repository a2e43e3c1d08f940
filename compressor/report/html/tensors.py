"""report.html's "largest tensors" chart: the 20 biggest constant tensors of each artifact, in
bytes as stored, coloured by dtype.

Each report.json row has `largest_tensors` (validation's inspection of the file, made by
runtimes/weights.largest_tensors()). For a report.json without them (older runs re-rendered by `compress
report`) the files in the run's folder are read back with the same inspect code `compress
inspect` uses; folders and files over MAX_INSPECT_BYTES are not: the chart is left out.
"""
from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

from compressor.errors import CompressorError
from compressor.render.html import para, section
from compressor.render.charts import BarRow, Segment, bar_chart, dtype_colour, legend
from compressor.render.sizes import human_size
from compressor.runtimes.weights import TOP, largest_tensors

MAX_INSPECT_BYTES = 64 << 20          # re-reading a big file would slow every report


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

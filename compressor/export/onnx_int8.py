"""The int8 ONNX of both backends: the model's float32 ONNX, quantized by onnxruntime's own
static QDQ quantizer with our calibration data (`quantize_onnx_static`).

The backends hand over the float graph: for ptq the float model, for qat the QAT-trained
weights without their fake-quant ops. Per-channel symmetric int8 is what QAT trained the
weights for (the same grid, also after BatchNorm folding, which scales whole channels), and
activation ranges are measured on the calibration data; a QAT model's accuracy survives
(see tests/backends/test_backend_int8.py). Pruned zeros stay exact zeros (zero point 0).
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from compressor.errors import DataError
from compressor.export.onnx import names_layer
from compressor.export.onnx_ranges import LearnedRanges, closest_to_float
from compressor.core.kernel_ops import ONNX_KERNEL_INPUTS
from compressor.core.tensors import matched

if TYPE_CHECKING:
    from compressor.core.record import RunRecord

CALIBRATION_BATCH = 32


def int8_onnx_from_float(proto: Any, samples: Any, float_layers: Sequence[str],
                         fallback_dtype: str, workdir: Path, mode: str = "ptq",
                         learned: Callable[[], LearnedRanges] | None = None,
                         record: RunRecord | None = None) -> Any:
    """The int8 model of the float32 `proto` in quantize `mode`: ptq (and qat's trained
    weights) static QDQ calibrated on `samples` (one array for a single-input model, or input
    name -> array; a callable giving them, asked only for ptq / qat); dynamic; weight_only.
    The kernels of `float_layers` (layer names / module paths, matched as precision
    `exclude` patterns are) stay float. `learned()`: the activation ranges QAT learned; the
    file quantized with them competes with the recalibrated one (onnx_ranges.py; its inputs
    matched to the graph's by name, else by position). `record`: where dynamic int8 notes
    the settings it tried (report.json "candidates")."""
    import onnx

    from compressor.export import onnx_quant

    folder = Path(workdir) / "onnx-int8"
    folder.mkdir(parents=True, exist_ok=True)
    source, target = folder / "float32.onnx", folder / "int8.onnx"
    onnx.save(proto, str(source))

    @functools.cache   # asked by each quantization and the choice between them
    def batches() -> list[dict[str, np.ndarray]]:
        arrays = samples() if callable(samples) else samples
        return onnx_quant.calibration_batches(_feeds(proto, arrays), CALIBRATION_BATCH)

    exclude = float_kernel_names(proto, float_layers)
    quantize_file(source, target, mode, batches, exclude, record=record)
    if learned is not None and mode not in ("dynamic", "weight_only"):
        ranges = learned()
        alternative = folder / "int8-learned-ranges.onnx"
        quantize_file(source, alternative, mode, batches, exclude,
                      LearnedRanges(_feeds(proto, ranges.inputs), ranges.ranges))
        target = closest_to_float(source, [target, alternative], batches())
    result = onnx.load(str(target))
    if float_layers:
        from compressor.export.onnx_mixed import keep_float_kernels

        keep_float_kernels(result, fallback_dtype)
    return result


def quantize_file(source: Path, target: Path, mode: str,
                  batches: Callable[[], list[dict[str, np.ndarray]]],
                  exclude_nodes: Sequence[str], learned: LearnedRanges | None = None,
                  record: RunRecord | None = None) -> None:
    """`source` quantized into `target` by onnxruntime's tools in quantize `mode`: dynamic
    (its settings chosen on `batches()` when there are training samples, and noted in
    `record`), weight_only, or static QDQ (ptq, and qat's trained weights) calibrated on
    `batches()`."""
    from compressor.export import onnx_quant

    if mode == "dynamic":
        tried = onnx_quant.quantize_onnx_dynamic(source, target, exclude_nodes=exclude_nodes,
                                                 calibration=_optional(batches))
        if record is not None:
            record.add_note_entry("candidates", tried["artifact"], tried)
    elif mode == "weight_only":
        onnx_quant.quantize_onnx_weight_only(source, target, exclude_nodes=exclude_nodes)
    else:
        onnx_quant.quantize_onnx_static(source, target, batches(), exclude_nodes=exclude_nodes,
                                        learned=learned)


def _optional(batches: Callable[[], list[dict[str, np.ndarray]]]) -> list[dict[str, np.ndarray]]:
    """The calibration batches, or none when the data has no training split: dynamic int8
    needs no data (it then skips only the outlier smoothing, which measures activations)."""
    try:
        return batches()
    except DataError:
        return []


def float_kernel_names(proto: Any, float_layers: Sequence[str]) -> list[str]:
    """Names of the conv / matmul / gemm nodes that belong to `float_layers`."""
    return [node.name for node in proto.graph.node if node.op_type in ONNX_KERNEL_INPUTS
            and any(names_layer(node, layer) for layer in float_layers)]


def _feeds(proto: Any, samples: np.ndarray | dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The samples keyed by the graph's input names (matched by name, else by position)."""
    initializers = {init.name for init in proto.graph.initializer}
    names = [value.name for value in proto.graph.input if value.name not in initializers]
    return dict(zip(names, matched(samples, names)))

"""A float ONNX graph -> the .onnx artifact of a scheme: as it is (float32), float16
weights (float32 I/O), or int8 with onnxruntime's quantization tools (export/onnx_quant.py):
static QDQ calibrated on training samples (ptq), dynamic, or weight-only.

Used by the ONNX backend and by the SavedModel backend (on the float32 ONNX that tf2onnx
makes from the SavedModel), whose handlers both come from `onnx/handlers.py`'s
`register_onnx_route`.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from compressor.backends.onnx.model import OnnxModel, describe_onnx
from compressor.backends.training_data import calibration_samples
from compressor.errors import DataError
from compressor.export.onnx import float16_onnx, save_checked_onnx
from compressor.core.tensors import matched

if TYPE_CHECKING:
    from compressor.core.context import Context
    from compressor.schemes import Float16, Int8Scheme

CALIBRATION_BATCH = 32


def onnx_float32(model: OnnxModel, path: Path, ctx: Context) -> Path:
    return save_checked_onnx(copy.deepcopy(model.proto), path, _log(ctx))


def onnx_float16(model: OnnxModel, scheme: Float16, path: Path, ctx: Context) -> Path:
    return save_checked_onnx(float16_onnx(copy.deepcopy(model.proto), scheme), path, _log(ctx))


def onnx_int8(model: OnnxModel, scheme: Int8Scheme, float_layers: tuple[str, ...], path: Path,
              ctx: Context) -> Path:
    """onnxruntime's int8 of the float graph in the scheme's mode (static QDQ calibrated on
    training samples, dynamic or weight-only); `float_layers` stay float."""
    from compressor.export.onnx_int8 import quantize_file

    quantize_file(model.float32_file(Path(ctx.workdir)), path, scheme.method,
                  lambda: _calibration(model, scheme, ctx), float_layers, record=ctx.record)
    if float_layers:
        import onnx

        from compressor.export.onnx_mixed import keep_float_kernels

        proto = onnx.load(str(path))
        keep_float_kernels(proto, scheme.fallback_dtype)
        save_checked_onnx(proto, path, _log(ctx))
    return path


def _log(ctx: Context) -> Path:
    log = Path(ctx.workdir) / "logs" / "onnx-export.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    return log


def _calibration(model: OnnxModel, scheme: Int8Scheme,
                 ctx: Context) -> list[dict[str, np.ndarray]]:
    """Calibration batches keyed by the graph's input names; a graph with a fixed batch size
    gets batches of exactly that size."""
    from compressor.export.onnx_quant import calibration_batches

    inputs = describe_onnx(model).inputs
    names = [spec.name for spec in inputs]
    arrays = dict(zip(names, matched(calibration_samples(ctx, scheme.calibration_samples),
                                     names)))
    fixed = _fixed_batch(model)
    if fixed:
        usable = len(next(iter(arrays.values()))) // fixed * fixed
        if usable == 0:
            raise DataError(f"the ONNX model has a fixed batch size of {fixed}, but int8 "
                            f"calibration has fewer samples; raise calibration_samples to {fixed}")
        arrays = {name: array[:usable] for name, array in arrays.items()}
    return calibration_batches(arrays, fixed or CALIBRATION_BATCH)


def _fixed_batch(model: OnnxModel) -> int | None:
    initializers = {init.name for init in model.proto.graph.initializer}
    for value in model.proto.graph.input:
        dims = value.type.tensor_type.shape.dim
        if value.name not in initializers and dims and dims[0].HasField("dim_value"):
            return dims[0].dim_value or None
    return None


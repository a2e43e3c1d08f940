"""A float ONNX graph -> the .onnx artifact a recipe asks for: as it is, float16 weights
(float32 I/O), or int8 with onnxruntime's quantization tools (export/onnx_quant.py):
static QDQ calibrated on training samples (ptq), dynamic, or weight-only.

Used by the ONNX backend and by the SavedModel backend (on the float32 ONNX that tf2onnx
makes from the SavedModel).
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from compressor.backends.onnx.model import OnnxModel, describe_onnx
from compressor.backends.training_data import calibration_samples
from compressor.errors import DataError, RecipeError
from compressor.export.onnx import float16_onnx, save_checked_onnx
from compressor.steps import PrecisionConfig, QuantizeConfig
from compressor.tensors import matched

if TYPE_CHECKING:
    from compressor.context import Context, ModelState

CALIBRATION_BATCH = 32


def onnx_artifact(model: OnnxModel, state: ModelState, path: Path, ctx: Context) -> Path:
    """Write the artifact for `state`'s recorded steps at `path`."""
    log = Path(ctx.workdir) / "logs" / "onnx-export.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    quantize, precision = state.last(QuantizeConfig), state.last(PrecisionConfig)
    if quantize is not None:
        return _int8(model, quantize, state.float_layers, path, ctx, log)
    proto = copy.deepcopy(model.proto)
    if precision is not None:
        proto = float16_onnx(proto, precision)
    return save_checked_onnx(proto, path, log)


def _int8(model: OnnxModel, quantize: QuantizeConfig, float_layers: tuple[str, ...],
          path: Path, ctx: Context, log: Path) -> Path:
    from compressor.export.onnx_int8 import quantize_file

    if quantize.mode == "qat":
        raise RecipeError(f"quantize mode {quantize.mode} needs training; use mode: ptq")
    quantize_file(model.float32_file(Path(ctx.workdir)), path, quantize.mode,
                  lambda: _calibration(model, quantize, ctx), float_layers)
    if float_layers:
        import onnx

        from compressor.export.onnx_mixed import keep_float_kernels

        proto = onnx.load(str(path))
        keep_float_kernels(proto, quantize.fallback_dtype)
        save_checked_onnx(proto, path, log)
    return path


def _calibration(model: OnnxModel, quantize: QuantizeConfig,
                 ctx: Context) -> list[dict[str, np.ndarray]]:
    """Calibration batches keyed by the graph's input names; a graph with a fixed batch size
    gets batches of exactly that size."""
    from compressor.export.onnx_quant import calibration_batches

    inputs = describe_onnx(model).inputs
    names = [spec.name for spec in inputs]
    arrays = dict(zip(names, matched(calibration_samples(ctx, quantize.calibration_samples),
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


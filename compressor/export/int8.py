"""The read-back check behind every "int8" artifact, for both formats and both backends.

An artifact is int8 when every conv / dense / matmul op computes in int8: its weights are
stored as int8 (ONNX: initializers behind DequantizeLinear) and, in TFLite, its activations
are int8 too. A converter that silently keeps float compute must not ship as "int8".
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from compressor.errors import BackendUnavailableError
from compressor.formats import format_named, format_of, resolve

if TYPE_CHECKING:
    from compressor.core.context import Context, ModelState


def export_checked(backend: Any, state: ModelState, fmt: str, path: Path, ctx: Context) -> Path:
    """`backend.export`, then, for a scheme that computes in int8, the read-back check: every export
    a run keeps or measures (the pipeline, the fallback search) goes through here, whatever
    the backend (a Backend; not named here, export/ never imports backends/)."""
    written = backend.export(state, fmt, path, ctx)
    # dynamic / weight_only compute in float by design; their integer weights are checked by
    # the weight-share gate on every integer artifact (validate.weight_share_at)
    if state.scheme.int8_compute:
        require_int8_kernels(written, state.scheme.method, len(state.float_layers))
    return written


def require_int8_kernels(path: Path, mode: str, allowed_float: int = 0) -> None:
    """Refuse (and delete) `path` when more than `allowed_float` kernel ops are float; the
    quantize fallback keeps that many layers float on purpose."""
    floats = float_kernels(path)
    if len(floats) <= allowed_float:
        return
    path.unlink()
    remedy = ("try quantize mode: ptq, or a float16 precision step" if mode == "qat"
              else "use a float16 precision step for this model instead")
    raise BackendUnavailableError(
        f"the int8 {format_of(path)} artifact kept {len(floats)} conv/dense op(s) in float: "
        f"{', '.join(floats[:5])}; these layers could not be quantized: {remedy}")


def float_kernels(path: Path) -> list[str]:
    """Kernel ops of `path` that compute in float: its format's own reader (compressor/formats
    `float_kernels`), else the kernel weights its inspector reads as float."""
    fmt = format_named(format_of(path))
    if fmt.float_kernels:
        return list(resolve(fmt.float_kernels)(path))
    from compressor.runtimes import inspect_artifact

    return [w.name for w in inspect_artifact(path).weights
            if w.is_kernel and w.dtype.startswith("float")]


def tflite_float_kernels(path: Path) -> list[str]:
    """A .tflite's conv / dense ops without int8 inputs (weights and activations)."""
    from compressor.export.tflite import float_kernel_ops

    return float_kernel_ops(Path(path).read_bytes())

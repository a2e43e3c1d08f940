"""Lower-precision floats (float16 / bfloat16) for weights, keeping float32 I/O by default.

The step sets the Float16 scheme; each model kind's float16 export handlers write it."""
from __future__ import annotations

from typing import TYPE_CHECKING

from compressor.core.context import Context, ModelState
from compressor.errors import BackendUnavailableError
from compressor.passes.registry import register_pass
from compressor.schemes import Float16, apply_scheme
from compressor.config.order import check_can_follow
from compressor.config.steps import PrecisionConfig

if TYPE_CHECKING:
    from compressor.backends.base import Backend

# Why each export format cannot deliver bfloat16 (checked on this stack, see tests).
BFLOAT16_BLOCKERS = {
    "tflite": "TFLite has no bfloat16 weight type (its converter offers float16 only)",
    "onnx": "ONNX can store bfloat16, but onnxruntime's CPU provider has no bfloat16 MatMul / "
            "Gemm / Conv kernels, so the artifact could not be run or validated",
}


@register_pass(PrecisionConfig)
def precision(state: ModelState, config: PrecisionConfig, ctx: Context,
              backend: Backend) -> ModelState:
    if config.dtype == "bfloat16":
        formats = ctx.formats or tuple(BFLOAT16_BLOCKERS)
        reasons = "; ".join(f"{fmt}: {BFLOAT16_BLOCKERS[fmt]}" for fmt in formats)
        raise BackendUnavailableError(f"precision dtype bfloat16 cannot be exported ({reasons}); "
                                      "use dtype: float16")
    check_can_follow(state.steps, config)
    return apply_scheme(backend, state, Float16.from_step(config), ctx).after(config)

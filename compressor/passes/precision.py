"""Lower-precision floats (float16 / bfloat16) for weights, keeping float32 I/O by default."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from compressor.context import Context, ModelState
from compressor.registry import StepConfig, register_pass


class PrecisionConfig(StepConfig):
    kind: Literal["precision"] = Field("precision", alias="pass")
    dtype: Literal["float16", "bfloat16"] = "float16"
    keep_io_types: bool = Field(True, description="keep model inputs/outputs float32")
    exclude: tuple[str, ...] = Field((), description="layer-name patterns kept in float32")


@register_pass(PrecisionConfig)
def precision(state: ModelState, config: PrecisionConfig, ctx: Context) -> ModelState:
    return ctx.backend.to_precision(state, config, ctx)

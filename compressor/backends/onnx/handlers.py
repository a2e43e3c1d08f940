"""The ONNX route's handler table: float32, float16 and onnxruntime's int8 (static QDQ,
dynamic, weight-only) of a float ONNX graph. `register_onnx_route` registers the same table
for any model kind that can hand over a float32 ONNX graph (.onnx files; SavedModels through
tf2onnx)."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from compressor.backends.post_training import register_training_refusal
from compressor.errors import RecipeError
from compressor.schemes import (Float16, Float32, Int8Dynamic, Int8Scheme, Int8Static,
                                Int8WeightOnly, apply_handler, export_handler)

if TYPE_CHECKING:
    from compressor.backends.onnx.model import OnnxModel
    from compressor.core.context import Context, ModelState

FloatGraph = Callable[["ModelState", "Context"], "OnnxModel"]
# who makes each int8 mode's file, and where its ranges come from (report.json `made_by`)
ORT_INT8 = {
    Int8Static: "onnxruntime quantize_static (QDQ, int8 weights per channel), activation "
                "ranges calibrated on training samples",
    Int8Dynamic: "onnxruntime quantize_dynamic (7-bit int8 weights per channel, activation "
                 "outliers smoothed into them on training samples), activation ranges computed "
                 "at run time",
    Int8WeightOnly: "onnxruntime weight-only int8 (DequantizeLinear per weight, per channel), "
                    "float compute",
}


def register_onnx_route(kind: str, float_graph: FloatGraph) -> None:
    """The ONNX export handlers of model `kind`, whose float32 graph `float_graph` gives."""
    from compressor.backends.onnx.export import onnx_float16, onnx_float32, onnx_int8

    @export_handler(Float32, kind, "onnx", made_by="the model's float32 graph")
    def _float32(backend: Any, state: ModelState, scheme: Float32, path, ctx: Context):
        return onnx_float32(float_graph(state, ctx), path, ctx)

    @export_handler(Float16, kind, "onnx", made_by="onnxruntime's float16 converter, float32 I/O")
    def _float16(backend: Any, state: ModelState, scheme: Float16, path, ctx: Context):
        return onnx_float16(float_graph(state, ctx), scheme, path, ctx)

    def _int8(backend: Any, state: ModelState, scheme: Int8Scheme, path, ctx: Context):
        return onnx_int8(float_graph(state, ctx), scheme, state.float_layers, path, ctx)

    for scheme_cls, made_by in ORT_INT8.items():
        export_handler(scheme_cls, kind, "onnx", made_by=made_by)(_int8)


def refuse_int8_io(kind: str, scheme: Int8Scheme) -> None:
    """Already-exported models keep float32 inputs and outputs in their int8 artifacts."""
    if scheme.io_dtype != "float32":
        raise RecipeError(f"quantize io_dtype {scheme.io_dtype} is not available for {kind} "
                          "models: their int8 artifacts keep float32 inputs and outputs; "
                          "remove io_dtype")


@apply_handler(Int8Scheme, "onnx")
def _check_int8(backend: Any, state: ModelState, scheme: Int8Scheme, ctx: Context) -> ModelState:
    refuse_int8_io("onnx", scheme)
    return state


register_training_refusal("onnx")
register_onnx_route("onnx", lambda state, ctx: state.model)

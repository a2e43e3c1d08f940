"""The ONNX backend: an .onnx file (or onnx.ModelProto) compressed after training.

int8 is onnxruntime's static QDQ quantization calibrated on the training split (ptq), or its
dynamic / weight-only modes; float16 via onnxconverter-common with float32 I/O. Training
steps are refused (`trains = False`), and the only artifact format is ONNX: a TFLite file
cannot be made from an ONNX graph with this stack.

Built-in image data is laid out after the model's first input: a 4-D float input with 1 or
3 channels on axis 1 (a torch export) gets NCHW, anything else NHWC (`image_layout`, set
by `load`). onnx / onnxruntime are imported only when a method runs.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from compressor.backends.base import ModelInfo
from compressor.backends.onnx import handlers  # noqa: F401  (registers the handlers)
from compressor.backends.post_training import PostTrainingBackend, image_layout_of
from compressor.errors import ModelLoadError

if TYPE_CHECKING:
    from compressor.core.context import ModelState
    from compressor.core.tensors import Arrays


class OnnxBackend(PostTrainingBackend):
    name = "onnx"

    def __init__(self) -> None:
        self.image_layout = "NHWC"   # until `load` reads the model's input shape

    def load(self, source: Any, *, weights: str | None = None, trust_pickle: bool = False) -> Any:
        """An OnnxModel; nothing in an ONNX file runs Python, so `trust_pickle` is moot."""
        from compressor.backends.onnx.model import load_onnx

        if weights is not None:
            raise ModelLoadError("an ONNX file holds its own weights; remove --weights")
        model = load_onnx(source)
        self.image_layout = image_layout_of(self.describe(model).inputs, "NHWC")
        return model

    def clone(self, model: Any) -> Any:
        import copy

        from compressor.backends.onnx.model import OnnxModel

        return OnnxModel(copy.deepcopy(model.proto), model.source)

    def describe(self, model: Any, example: Arrays | None = None) -> ModelInfo:
        from compressor.backends.onnx.model import describe_onnx

        return describe_onnx(model)

    def predict(self, model: Any, x: Arrays, batch_size: int = 256) -> Arrays:
        from compressor.backends.onnx.model import predict_onnx

        return predict_onnx(model, x, batch_size)

    def quantizable_layers(self, state: ModelState) -> list[str]:
        """Node names of Conv / MatMul / Gemm with constant weights (quantize fallback keeps
        the chosen ones float through onnxruntime's nodes_to_exclude)."""
        from compressor.backends.onnx.model import quantizable_nodes

        return quantizable_nodes(state.model.proto)

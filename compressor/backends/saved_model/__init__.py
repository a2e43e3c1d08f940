"""The SavedModel backend: TensorFlow SavedModels without Keras metadata, compressed after
training.

`tf.saved_model.save(model, dir)` and Keras 3 `model.export(dir)` write no Keras model
config, so there are no layers to prune or fine-tune: only the serving signature, which
the converters read. A SavedModel that tf_keras wrote (with keras_metadata.pb) goes to the
Keras backend instead, with every recipe available.

- int8 (ptq): TFLite from tf.lite.TFLiteConverter.from_saved_model with a representative
  dataset of training samples (full int8 compute, float32 I/O); ONNX from tf2onnx's float32
  graph quantized by onnxruntime (static QDQ), as for .onnx models.
- fp16: float16 weights, float32 I/O, in both formats.
- dynamic / weight_only: ONNX only. Training steps and `fallback: auto` are refused.

The handler table (one registration per scheme and format) is handlers.py.

A separate backend rather than a Keras one: it shares no code path with tf_keras models
(no layers, no tfmot), only TensorFlow's lazy import and the tf2onnx call.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from compressor.backends.base import ModelInfo
from compressor.backends.post_training import PostTrainingBackend, image_layout_of
from compressor.backends.saved_model import handlers  # noqa: F401  (registers the handlers)
from compressor.errors import ModelLoadError

if TYPE_CHECKING:
    from compressor.core.context import ModelState
    from compressor.core.tensors import Arrays


class SavedModelBackend(PostTrainingBackend):
    """Export through the handler table (a SchemeExporter, via PostTrainingBackend); the
    refusals of what a SavedModel cannot do are its int8 apply handlers (handlers.py)."""

    name = "saved_model"

    def __init__(self) -> None:
        self.image_layout = "NHWC"   # TensorFlow's own; `load` checks the signature

    def load(self, source: Any, *, weights: str | None = None, trust_pickle: bool = False) -> Any:
        """The loaded SavedModel; TensorFlow graphs hold no pickled Python, so
        `trust_pickle` is moot."""
        from compressor.backends.saved_model.model import load_saved_model

        if weights is not None:
            raise ModelLoadError("a SavedModel folder holds its own weights; remove --weights")
        model = load_saved_model(source)
        self.image_layout = image_layout_of(model.inputs, "NHWC")
        return model

    def clone(self, model: Any) -> Any:
        return model   # read-only: nothing here changes a loaded SavedModel or its folder

    def describe(self, model: Any, example: Arrays | None = None) -> ModelInfo:
        from compressor.backends.saved_model.model import describe_saved_model

        return describe_saved_model(model)

    def predict(self, model: Any, x: Arrays, batch_size: int = 256) -> Arrays:
        from compressor.backends.saved_model.model import predict_saved_model

        return predict_saved_model(model, x, batch_size)

    def quantizable_layers(self, state: ModelState) -> list[str]:
        """None: a SavedModel's ops have no layer names the converters could keep float."""
        return []

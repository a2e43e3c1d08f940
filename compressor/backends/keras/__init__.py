"""The Keras backend: tf_keras (Keras 2) models, tfmot for pruning and QAT, the TFLite
converter and tf2onnx for export (one handler per scheme and format: handlers.py).

TensorFlow is imported lazily (see env.py), so constructing a KerasBackend is free. Every
method works on copies: the caller's model and file are never modified.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from compressor.backends.base import ModelInfo, SchemeExporter
from compressor.backends.keras import handlers  # noqa: F401  (registers the handlers)

if TYPE_CHECKING:
    from compressor.core.tensors import Arrays
    from compressor.backends.base import UserTraining
    from compressor.core.context import Context, ModelState
    from compressor.config.steps import DistillConfig, PruneConfig, StepConfig


class KerasBackend(SchemeExporter):
    """tf_keras models; schemes are applied and written by the handlers in handlers.py."""

    name = "keras"
    image_layout = "NHWC"

    def __init__(self) -> None:
        from compressor.backends.keras.tflite import ConversionCache

        # The fallback search re-quantizes one calibrated model many times: TFLite
        # conversions are kept per model object.
        self.conversions = ConversionCache()

    def load(self, source: Any, *, weights: str | None = None, trust_pickle: bool = False) -> Any:
        from compressor.backends.keras.load import load_keras_model

        return load_keras_model(source, weights=weights, trust_pickle=trust_pickle)

    def clone(self, model: Any) -> Any:
        from compressor.backends.keras.load import clone_keras_model

        return clone_keras_model(model)

    def describe(self, model: Any, example: Arrays | None = None) -> ModelInfo:
        """Params and named I/O; Keras models declare their inputs, so `example` is not needed
        (the pipeline checks the data against them)."""
        from compressor.backends.keras.io import describe

        return describe(model)

    def predict(self, model: Any, x: Arrays, batch_size: int = 256) -> Arrays:
        from compressor.backends.keras.io import predict

        return predict(model, x, batch_size)

    def prune(self, state: ModelState, config: PruneConfig, ctx: Context) -> ModelState:
        """unstructured: zeros in place (tfmot); channel: a smaller dense model."""
        if config.structure == "channel":
            from compressor.backends.keras.channels import channel_pruned

            return channel_pruned(state, config, ctx)
        from compressor.backends.keras.optimize import pruned_model

        return state.replace(model=pruned_model(state, config, ctx))

    def preflight(self, model: Any, steps: tuple[StepConfig, ...],
                  formats: tuple[str, ...]) -> None:
        """Refuse a step the model's layers cannot take (QAT on a layer tfmot cannot wrap)
        before any step runs."""
        from compressor.backends.keras.preflight import check_steps

        check_steps(model, steps)

    def quantizable_layers(self, state: ModelState) -> list[str]:
        """Layers int8 quantizes (conv / dense kernels): what quantize fallback may keep float."""
        from compressor.backends.keras.mixed import kernel_layer_names

        return kernel_layer_names(state.model)

    def distill(self, state: ModelState, config: DistillConfig, ctx: Context) -> ModelState:
        """Train with the KD loss; the recorded step makes later pruning / QAT keep using it."""
        from compressor.backends.keras.distill import distilled_model

        return state.replace(model=distilled_model(state, config, ctx))

    def start_user_training(self, state: ModelState, step: StepConfig | None, ctx: Context,
                            steps_per_epoch: int | None = None) -> UserTraining:
        from compressor.backends.keras.user_loop import start_user_training

        return start_user_training(state, step, ctx, steps_per_epoch)

    def end_user_training(self, training: UserTraining, ctx: Context) -> ModelState:
        from compressor.backends.keras.user_loop import end_user_training

        return end_user_training(training, ctx)

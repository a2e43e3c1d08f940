"""What backends of already-exported models share: ONNX files and TensorFlow SavedModels
without Keras metadata. Such a model has no training graph, so these backends do only
post-training work: int8 calibration (ptq; dynamic and weight_only where the format allows),
float16, and export. Recipe steps that train (prune, distill, quantize mode qat) are refused
before any work (session.py checks `trains`); the methods below refuse them too, for callers
that reach a backend directly.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from compressor.errors import RecipeError
from compressor.tensors import TensorSpec, is_integer

if TYPE_CHECKING:
    from compressor.context import Context, ModelState
    from compressor.steps import (DistillConfig, PrecisionConfig, PruneConfig, QuantizeConfig,
                                  StepConfig)

NO_TRAINING_FIX = "use int8 (ptq), fp16 or mixed_int8_fp16"
IMAGE_CHANNELS = (1, 3)


def training_refused(backend_name: str, index: int, step: StepConfig) -> RecipeError:
    """The error for recipe step `index` (0-based) that trains, on a backend that cannot."""
    mode = " (mode qat)" if step.kind == "quantize" else ""
    return RecipeError(f"the {backend_name} backend does not train: step {index + 1} "
                       f"`{step.kind}`{mode} fine-tunes the model and needs a Keras or PyTorch "
                       f"model; {NO_TRAINING_FIX}")


def image_layout_of(inputs: tuple[TensorSpec, ...], default: str) -> str:
    """How the built-in image data must be laid out for a model that only declares shapes: a
    4-D float input with 1 or 3 channels on axis 1 is NCHW (torch exports), else `default`."""
    for spec in inputs:
        if len(spec.shape) == 4 and not is_integer(spec.dtype) and spec.shape[1] in IMAGE_CHANNELS:
            return "NCHW"
    return default


class PostTrainingBackend:
    """The training half of the Backend protocol for models that cannot be trained; the
    subclass provides load, clone, describe, predict, quantizable_layers and export."""

    name = "post-training"
    trains = False
    export_formats: tuple[str, ...] = ("onnx",)

    def prune(self, state: ModelState, config: PruneConfig, ctx: Context) -> ModelState:
        raise training_refused(self.name, len(state.steps), config)

    def distill(self, state: ModelState, config: DistillConfig, ctx: Context) -> ModelState:
        raise training_refused(self.name, len(state.steps), config)

    def quantize(self, state: ModelState, config: QuantizeConfig, ctx: Context) -> ModelState:
        """Nothing to do before export, which calibrates (ptq) or quantizes (dynamic,
        weight_only) the float model; qat needs training and is refused."""
        if config.trains:
            raise training_refused(self.name, len(state.steps), config)
        if config.io_dtype != "float32":
            raise RecipeError(f"quantize io_dtype {config.io_dtype} is not available for "
                              f"{self.name} models: their int8 artifacts keep float32 inputs "
                              "and outputs; remove io_dtype")
        return state

    def to_precision(self, state: ModelState, config: PrecisionConfig, ctx: Context) -> ModelState:
        return state   # export reads the recorded step

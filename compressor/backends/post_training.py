"""What backends of already-exported models share: ONNX files and TensorFlow SavedModels
without Keras metadata. Such a model has no training graph, so these backends do only
post-training work: int8 calibration (ptq; dynamic and weight_only where the format allows),
float16, and export. Recipe steps that train (prune, distill, quantize mode qat) are refused
before any work (session.py: such a backend has no training loop), and by the passes for
callers that reach a backend directly (no Pruning / Distilling capability; a qat apply
handler that refuses).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from compressor.backends.base import SchemeExporter
from compressor.errors import RecipeError
from compressor.core.tensors import TensorSpec, is_integer

if TYPE_CHECKING:
    from compressor.core.context import Context, ModelState
    from compressor.config.steps import StepConfig

NO_TRAINING_FIX = "use int8 (ptq), fp16 or mixed_int8_fp16"
IMAGE_CHANNELS = (1, 3)


# What a kind without a training loop says of a step that trains; a kind may set its own
# (`training_refusal` on its backend class: the language-model kind names its recipes).
TRAINING_REFUSAL = ("the {kind} backend does not train: step {number} `{step}`{mode} fine-tunes "
                    "the model and needs a Keras or PyTorch model; " + NO_TRAINING_FIX)


def training_refused(backend: Any, index: int, step: StepConfig) -> RecipeError:
    """The error for recipe step `index` (0-based) that trains, on a backend that cannot."""
    mode = " (mode qat)" if step.kind == "quantize" else ""
    template = getattr(backend, "training_refusal", TRAINING_REFUSAL)
    return RecipeError(template.format(kind=backend.name, number=index + 1, step=step.kind,
                                       mode=mode))


def register_training_refusal(kind: str) -> None:
    """A qat scheme applied to a model `kind` without a training loop is refused, naming the
    step (for callers that reach the pass directly; a recipe is refused before any work)."""
    from compressor.schemes import Int8Qat, apply_handler

    @apply_handler(Int8Qat, kind)
    def _refuse_qat(backend: Any, state: ModelState, scheme: Int8Qat, ctx: Context) -> ModelState:
        raise training_refused(backend, len(state.steps), scheme.training)


def image_layout_of(inputs: tuple[TensorSpec, ...], default: str) -> str:
    """How the built-in image data must be laid out for a model that only declares shapes: a
    4-D float input with 1 or 3 channels on axis 1 is NCHW (torch exports), else `default`."""
    for spec in inputs:
        if len(spec.shape) == 4 and not is_integer(spec.dtype) and spec.shape[1] in IMAGE_CHANNELS:
            return "NCHW"
    return default


class PostTrainingBackend(SchemeExporter):
    """What already-exported model kinds share: export through the handler table, and no
    training capability (no Pruning, Distilling or user loop: such steps are refused before
    any work). The subclass provides load, clone, describe, predict and, where it can name
    layers, quantizable_layers."""

    name = "post-training"

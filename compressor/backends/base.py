"""The backend capabilities: the only place framework work happens.

Every model kind has model I/O (`Backend`); the rest are small capability protocols
(Pruning, Distilling, LayerSelection, Planning, TextModel, Preflight, UserLoopBackend) that a
kind implements when it can, and that passes ask for (`capable`) instead of calling a method
that would do nothing. Quantization schemes are not methods: they are handlers registered
per (scheme, model kind, format) in compressor/schemes, so a new scheme or mode never adds a
method.
Each trainable backend keeps its training loop in one place so that a distribution
strategy / process group can wrap model, data and optimizer.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from compressor.core.tensors import Arrays, TensorSpec

if TYPE_CHECKING:
    from compressor.core.context import Context, ModelState
    from compressor.config.steps import DistillConfig, PruneConfig, StepConfig


@dataclass(frozen=True)
class ModelInfo:
    """What validation and reports need to know about a framework model: its named inputs and
    outputs in the model's order (shapes batch first, None where dynamic)."""

    params: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    size_bytes: int                       # weight bytes as the framework holds them
    layer_kinds: frozenset[str] = frozenset()   # attention / layernorm / embedding / recurrent

    @property
    def input_shape(self) -> tuple[int | None, ...]:
        return self.inputs[0].shape

    @property
    def input_dtype(self) -> str:
        return self.inputs[0].dtype

    @property
    def output_shape(self) -> tuple[int | None, ...]:
        return self.outputs[0].shape

    @property
    def input_names(self) -> list[str]:
        return [spec.name for spec in self.inputs]


class Backend(Protocol):
    """Model I/O, the capability every model kind has. What else a kind can do is a
    capability of its own below (a Protocol, checked with `capable`); quantization schemes
    are handlers registered per model kind and format (compressor/schemes), and a backend
    writes artifacts through that table (`SchemeExporter.export`)."""

    name: str          # the model kind: "keras" | "torch" | "onnx" | "saved_model" | "llm"
    task: str          # what its models are for (compressor/tasks): "array" | "lm"
    image_layout: str  # how built-in image data is laid out for this framework: "NHWC" | "NCHW"

    def load(self, source: Any, *, weights: str | None = None, trust_pickle: bool = False) -> Any:
        """A model from a path, `module:function`, or an in-memory model (cloned, never mutated)."""

    def clone(self, model: Any) -> Any:
        """A private copy with equal weights, so passes never touch the caller's model."""

    def describe(self, model: Any, example: Arrays | None = None) -> ModelInfo:
        """Params and I/O of `model`; `example` (a few inputs) is for frameworks whose modules do
        not declare an input shape: it is run once, and a DataError says if it does not fit."""

    def predict(self, model: Any, x: Arrays, batch_size: int = 256) -> Arrays:
        """Raw outputs (logits) of the framework model, in inference mode: one array, or a dict
        name -> array for several outputs. `x` is one array or a dict name -> array."""

    def export(self, state: ModelState, fmt: str, path: Path, ctx: Context) -> Path:
        """Write the artifact for `fmt` ("tflite" | "onnx") at `path` in `state.scheme`."""


@runtime_checkable
class Pruning(Protocol):
    """A model kind whose weights can be pruned and fine-tuned."""

    def prune(self, state: ModelState, config: PruneConfig, ctx: Context) -> ModelState:
        """The state with `config.sparsity` of each prunable kernel zeroed (or whole channels
        removed), fine-tuned."""


@runtime_checkable
class Distilling(Protocol):
    """A model kind that can be trained against a teacher's soft targets."""

    def distill(self, state: ModelState, config: DistillConfig, ctx: Context) -> ModelState:
        """The state trained against `ctx.teacher`'s soft targets (pruned zeros kept)."""


@runtime_checkable
class LayerSelection(Protocol):
    """A model kind whose layers can be named for per-layer choices (quantize fallback)."""

    def quantizable_layers(self, state: ModelState) -> list[str]:
        """Names of the layers int8 quantizes, which `state.float_layers` may name instead."""


@runtime_checkable
class Planning(Protocol):
    """A model kind that can be planned from shapes alone, without loading weights
    (`compress plan`; language models)."""

    def plan_shapes(self, source: Any) -> Any:
        """The model's tensor shapes and dtypes by kind, read from its config / headers."""


@runtime_checkable
class TextModel(Protocol):
    """A language model: able to continue a prompt (the reference greedy text); its tokenizer
    cuts the task's text windows (tasks/lm/windows.py)."""

    def generate(self, model: Any, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        """Greedy continuation of `prompt_ids` (the reference for an artifact's)."""


@runtime_checkable
class Preflight(Protocol):
    """A model kind that can tell from the loaded model, before any step runs, that a recipe
    step cannot work on it (a refusal after minutes of pruning wastes them)."""

    def preflight(self, model: Any, steps: tuple[StepConfig, ...],
                  formats: tuple[str, ...]) -> None:
        """Return when every step can run on `model`; else raise a CompressorError (exit 2)
        naming the step, the layer that blocks it and the fix."""


def capable(backend: Any, capability: type, fix: str) -> Any:
    """`backend` if it has `capability`, else a RecipeError naming the model kind and `fix`."""
    if isinstance(backend, capability):
        return backend
    from compressor.errors import RecipeError

    raise RecipeError(f"{backend.name} models have no {capability.__name__} capability: {fix}")


class SchemeExporter:
    """`export` and `export_formats` for every model kind, from the handler table: the
    handler registered for (state.scheme, this kind, fmt) writes the file."""

    name: str   # the model kind, set by the backend class
    task: str = "array"   # the task its models serve (compressor/tasks); language models: "lm"

    @property
    def export_formats(self) -> tuple[str, ...]:
        from compressor.schemes import formats_of

        return formats_of(self.name)

    def trains_step(self, step: StepConfig) -> bool:
        """Whether this kind runs a training `step` itself without a user-loop training stack
        (a language model's int4 QAT); a kind with a training loop runs them all."""
        return False

    def export(self, state: ModelState, fmt: str, path: Path, ctx: Context) -> Path:
        from compressor.errors import BackendUnavailableError, ModelLoadError
        from compressor.export import FORMATS
        from compressor.schemes import find_export

        if state.model is None:
            raise ModelLoadError("there is no model to export; load one first")
        if fmt not in FORMATS:
            raise BackendUnavailableError(f"cannot export to {fmt!r}; the formats are "
                                          f"{', '.join(FORMATS)}")
        handler = find_export(state.scheme, self.name, fmt)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        return handler.write(self, state, state.scheme, path, ctx)


@dataclass
class UserTraining:
    """A recipe step handed to the user's own training loop (see compressor.run.user_loop).

    `model` is what the user trains (pruning wrappers / masks, fake-quant ranges in place);
    `callbacks` go to Keras `fit`; `loss(outputs, target, inputs=None)` is the step's loss for
    PyTorch loops (the task loss, plus the teacher's term while distilling); `after_step(n)`
    runs after the user's n-th optimizer step (pruning schedule, masks). `state` and `step`
    are where it started; `backend_state` is what the backend keeps until `end_user_training`.
    """

    state: ModelState
    step: StepConfig | None          # None: plain fine-tuning of a trainable copy
    model: Any
    callbacks: tuple[Any, ...] = ()
    loss: Callable[..., Any] | None = None
    after_step: Callable[[int], None] | None = None
    backend_state: Any = None


@runtime_checkable
class UserLoopBackend(Protocol):
    """A backend whose training steps can run inside the user's own loop (`cz.prepare`)."""

    def start_user_training(self, state: ModelState, step: StepConfig | None, ctx: Context,
                            steps_per_epoch: int | None = None) -> UserTraining:
        """Set up `step` (prune, qat quantize or distill; None: plain fine-tuning) for the user's
        loop instead of the backend's; its schedule spans `step.epochs` x `steps_per_epoch`
        optimizer steps (default: the training split in batches of `step.batch_size`)."""

    def end_user_training(self, training: UserTraining, ctx: Context) -> ModelState:
        """The state as `step`'s pass would leave it (without recording the step): wrappers
        stripped, final masks applied."""

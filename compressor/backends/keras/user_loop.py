"""A recipe's training step inside the user's own Keras loop (`fit` or a GradientTape loop).

The user compiles and trains the wrapped model; tfmot's wrappers count the optimizer steps
themselves (each `model(x, training=True)` call), so a Keras run needs only the
UpdatePruningStep callback, and `after_step` stays unset.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from compressor.backends.base import UserTraining
from compressor.backends.keras.env import import_tfmot
from compressor.backends.keras.load import clone_keras_model
from compressor.backends.keras.optimize import (one_shot_pruned, pruning_schedule,
                                                quantization_aware_model, with_pruning_wrappers)
from compressor.backends.training_data import steps_per_epoch
from compressor.errors import BackendUnavailableError

if TYPE_CHECKING:
    from compressor.core.context import Context, ModelState
    from compressor.config.steps import PruneConfig, StepConfig


def start_user_training(state: ModelState, step: StepConfig | None, ctx: Context,
                        steps_per_epoch_: int | None) -> UserTraining:
    kind = step.kind if step is not None else None
    if kind == "prune" and not step.leaves_zeros:
        # Channels go first, in one shot; the user's loop then fine-tunes the smaller model.
        from compressor.backends.keras.channels import channel_pruned

        state = channel_pruned(state, step.model_copy(update={"epochs": 0}), ctx)
        return UserTraining(state=state, step=step, model=clone_keras_model(state.model))
    if kind == "prune":
        model, callbacks = _pruning_model(state.model, step, ctx, steps_per_epoch_)
        return UserTraining(state=state, step=step, model=model, callbacks=callbacks)
    if kind == "quantize":
        # epochs 0: the backend builds the fake-quant copy and leaves the training to the user.
        model = quantization_aware_model(state, step.model_copy(update={"epochs": 0}), ctx)
        return UserTraining(state=state, step=step, model=model)
    if kind == "distill":
        raise BackendUnavailableError(
            "a distill step cannot run in your own Keras loop yet (its loss needs the teacher's "
            "outputs per batch); use cz.compress for this recipe, or start from a recipe "
            "without distill")
    return UserTraining(state=state, step=step, model=clone_keras_model(state.model))


def end_user_training(training: UserTraining, ctx: Context) -> ModelState:
    step, state = training.step, training.state
    kind = step.kind if step is not None else None
    if kind == "prune" and step.leaves_zeros:
        stripped = import_tfmot().sparsity.keras.strip_pruning(training.model)
        # Exactly the recipe's sparsity, also when the loop stopped before the schedule's end.
        return state.replace(model=one_shot_pruned(stripped, step.sparsity))
    return state.replace(model=training.model)


def _pruning_model(model: Any, config: PruneConfig, ctx: Context,
                   steps_per_epoch_: int | None) -> tuple[Any, tuple[Any, ...]]:
    tfmot = import_tfmot()
    steps = steps_per_epoch_ or steps_per_epoch(ctx, config, f"pruning to {config.sparsity:.0%}")
    schedule = pruning_schedule(tfmot, config, steps)
    wrapped = with_pruning_wrappers(clone_keras_model(model), schedule, tfmot)
    callback = tfmot.sparsity.keras.UpdatePruningStep()
    # Starts the wrappers' step counters at 0 now, so a GradientTape loop works without the
    # callback; `fit` calling it again changes nothing.
    callback.set_model(wrapped)
    callback.on_train_begin()
    return wrapped, (callback,)

"""Magnitude pruning and quantization-aware training with tfmot, on private model copies."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from compressor.backends.keras.env import fake_quant_layer_types, import_tf_keras, import_tfmot
from compressor.backends.keras.input_fold import input_folded
from compressor.backends.keras.io import calibration_inputs
from compressor.backends.keras.load import clone_keras_model
from compressor.backends.keras.train import fine_tune
from compressor.backends.training_data import steps_per_epoch
from compressor.backends.training_rules import keeps_pruned_zeros
from compressor.errors import BackendUnavailableError, first_line
from compressor.config.steps import DistillConfig, PruneConfig

if TYPE_CHECKING:
    from compressor.core.context import Context, ModelState
    from compressor.config.steps import QuantizeConfig

MASK_UPDATES = 10   # how many times the pruning mask is recomputed while sparsity ramps up
FOLD_CHECK_SAMPLES = 32   # training inputs that tell whether the stem reads a narrow band


def pruned_model(state: ModelState, config: PruneConfig, ctx: Context) -> Any:
    """A copy of the model whose prunable kernels are `config.sparsity` zeros, fine-tuned
    (with the teacher's KD loss after a distill step)."""
    model = state.model
    if config.epochs == 0:
        return one_shot_pruned(clone_keras_model(model), config.sparsity)
    tfmot = import_tfmot()
    description = f"pruning to {config.sparsity:.0%}"
    steps = steps_per_epoch(ctx, config, description)
    schedule = pruning_schedule(tfmot, config, steps)
    # The copy is made inside the build function, so a strategy scope covers its variables.
    trained = fine_tune(lambda: with_pruning_wrappers(clone_keras_model(model), schedule, tfmot),
                        model, config, ctx, description,
                        callbacks=[tfmot.sparsity.keras.UpdatePruningStep()],
                        distill=state.last(DistillConfig),
                        eligible=lambda step: step >= schedule.end_step)
    return tfmot.sparsity.keras.strip_pruning(trained)


def quantization_aware_model(state: ModelState, config: QuantizeConfig, ctx: Context) -> Any:
    """A QAT copy of the model (fake-quant int8), fine-tuned for `config.epochs` (with the
    teacher's KD loss after a distill step); pruned zeros stay zero after a prune step."""
    # Preprocessing that leaves the stem conv a narrow band is folded into it first: QAT's
    # fake-quant would round that band to a few levels in every training step (input_fold.py).
    model = input_folded(state.model,
                         lambda: calibration_inputs(state.model, ctx, FOLD_CHECK_SAMPLES))
    preserve = keeps_pruned_zeros(state, config)
    return fine_tune(lambda: _with_fake_quant(clone_keras_model(model), preserve),
                     model, config, ctx, "int8 quantization-aware training",
                     distill=state.last(DistillConfig), freeze_bn_after=config.freeze_bn_after)


def pruning_schedule(tfmot: Any, config: PruneConfig, steps: int) -> Any:
    """tfmot's sparsity schedule. Its last mask update is in optimizer step `end_step` (the
    wrappers count steps from 1; -1 for constant: full sparsity from the first step), so an
    epoch ending after optimizer step s is at full sparsity when s >= end_step."""
    total = steps * config.epochs
    # Reach the final sparsity before the last epoch, so that epoch only recovers accuracy.
    ramp = total - steps if config.epochs > 1 else max(1, total // 2)
    frequency = max(1, ramp // MASK_UPDATES)
    end_step = frequency * (ramp // frequency)   # the last mask update lands exactly on it
    sparsity = tfmot.sparsity.keras
    if config.schedule == "constant":
        return sparsity.ConstantSparsity(config.sparsity, begin_step=0, frequency=frequency)
    return sparsity.PolynomialDecay(initial_sparsity=0.0, final_sparsity=config.sparsity,
                                    begin_step=0, end_step=end_step, frequency=frequency)


def with_pruning_wrappers(model: Any, schedule: Any, tfmot: Any) -> Any:
    """Wrap every layer tfmot can prune; others (custom, weightless) stay as they are."""
    tf_keras = import_tf_keras()
    # PruneRegistry is not in tfmot's public API; it is the list prune_low_magnitude checks.
    from tensorflow_model_optimization.python.core.sparsity.keras.prune_registry import (
        PruneRegistry,
    )

    prunable_cls = tfmot.sparsity.keras.PrunableLayer

    def wrap(layer: Any) -> Any:
        if isinstance(layer, tf_keras.Model):
            return tf_keras.models.clone_model(layer, clone_function=wrap)
        if isinstance(layer, prunable_cls) or (PruneRegistry.supports(layer) and _has_kernel(layer)):
            return tfmot.sparsity.keras.prune_low_magnitude(layer, pruning_schedule=schedule)
        return layer

    return tf_keras.models.clone_model(model, clone_function=wrap)


def _has_kernel(layer: Any) -> bool:
    return any(len(w.shape) >= 2 for w in layer.weights) or not layer.built


def one_shot_pruned(model: Any, sparsity: float) -> Any:
    """Zero the smallest-magnitude `sparsity` fraction of each kernel, without fine-tuning."""
    for layer in _leaf_layers(model):
        for weight in layer.trainable_weights:
            if len(weight.shape) < 2:   # biases and norms are not pruned, as in tfmot
                continue
            values = weight.numpy()
            count = round(sparsity * values.size)
            if count:
                flat = values.reshape(-1)
                flat[np.argpartition(np.abs(flat), count - 1)[:count]] = 0.0
                weight.assign(flat.reshape(values.shape))
    return model


def _leaf_layers(model: Any) -> list:
    return [leaf for layer in model.layers
            for leaf in (_leaf_layers(layer) if hasattr(layer, "layers") else [layer])]


def _with_fake_quant(model: Any, preserve_sparsity: bool) -> Any:
    from compressor.backends.keras.qat_layers import with_fake_quant

    tfmot = import_tfmot()
    # Plain quantize_model refills pruned weights (30% -> ~10% zeros): the prune-preserving
    # scheme keeps the zeros while the int8 ranges are learned.
    scheme = (tfmot.experimental.combine.Default8BitPrunePreserveQuantizeScheme()
              if preserve_sparsity else None)
    try:
        return with_fake_quant(model, scheme)
    except (ValueError, RuntimeError, TypeError, AttributeError) as exc:
        raise BackendUnavailableError(
            f"tfmot cannot add int8 quantization-aware training to this model ({first_line(exc)}); "
            "use quantize mode: ptq, which lets the converter quantize the layers it supports"
        ) from None


def without_fake_quant(model: Any) -> Any:
    """The float model inside a QAT model: each quantize wrapper replaced by the layer it
    wraps, with the QAT-trained weights; input quantize layers become identities. A model
    without tfmot quantization is returned as it is."""
    tf_keras = import_tf_keras()
    quantize = import_tfmot().quantization.keras
    wrappers, input_quantizer = fake_quant_layer_types()
    if not any(isinstance(layer, (*wrappers, input_quantizer)) for layer in model.layers):
        return model

    def unwrap(layer: Any) -> Any:
        if isinstance(layer, wrappers):
            return layer.layer.__class__.from_config(layer.layer.get_config())
        if isinstance(layer, input_quantizer):
            return tf_keras.layers.Activation("linear", name=layer.name)
        return layer.__class__.from_config(layer.get_config())

    with quantize.quantize_scope():
        plain = tf_keras.models.clone_model(model, clone_function=unwrap)
    for old, new in zip(model.layers, plain.layers):
        if isinstance(old, wrappers):
            # The wrapper, not the inner layer, tracks the quantized kernel: match by name
            # ('conv2d/kernel:0'); the wrapper's own range variables are left out.
            trained = {w.name.split("/")[-1]: w.numpy() for w in old.weights
                       if w.name.startswith(old.layer.name + "/")}
            new.set_weights([trained[w.name.split("/")[-1]] for w in new.weights])
        elif not isinstance(old, input_quantizer):   # its weights are the input's range
            new.set_weights(old.get_weights())
    return plain

"""The Keras backend: tf_keras (Keras 2) models, tfmot for pruning and QAT.

TensorFlow is imported lazily (see keras_env.py), so constructing a KerasBackend is free.
Every method works on copies: the caller's model and file are never modified.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from compressor.backends.base import ModelInfo
from compressor.errors import ModelLoadError

if TYPE_CHECKING:
    from compressor.backends.base import UserTraining
    from compressor.context import Context, ModelState
    from compressor.passes.distill import DistillConfig
    from compressor.passes.precision import PrecisionConfig
    from compressor.passes.prune import PruneConfig
    from compressor.passes.quantize import QuantizeConfig
    from compressor.registry import StepConfig

FLOAT32_BYTES = 4


class KerasBackend:
    name = "keras"
    image_layout = "NHWC"

    def load(self, source: Any, *, weights: str | None = None, trust_pickle: bool = False) -> Any:
        from compressor.backends.keras_load import load_keras_model

        return load_keras_model(source, weights=weights, trust_pickle=trust_pickle)

    def save(self, model: Any, path: Path) -> Path:
        """Save as .keras (or .h5 if asked); returns the path actually written."""
        from compressor.backends.keras_load import has_tfmot_layers

        path = Path(path)
        if path.suffix not in (".keras", ".h5") or has_tfmot_layers(model):
            # tf_keras cannot reload QAT wrappers from .keras (variable count mismatch); .h5 works.
            path = path.with_suffix(".h5" if has_tfmot_layers(model) else ".keras")
        path.parent.mkdir(parents=True, exist_ok=True)
        options = {"include_optimizer": False} if path.suffix == ".h5" else {}
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*HDF5 file.*legacy", category=UserWarning)
            model.save(str(path), **options)
        return path

    def clone(self, model: Any) -> Any:
        from compressor.backends.keras_load import clone_keras_model

        return clone_keras_model(model)

    def describe(self, model: Any, example: np.ndarray | None = None) -> ModelInfo:
        """Params and I/O of the first input / output; Keras models declare their input
        shape, so `example` is not needed (the pipeline checks data against input_shape)."""
        first_input, first_output = model.inputs[0], model.outputs[0]
        params = int(model.count_params())
        return ModelInfo(params=params,
                         input_shape=(None, *tuple(first_input.shape)[1:]),
                         input_dtype=first_input.dtype.name,
                         output_shape=(None, *tuple(first_output.shape)[1:]),
                         size_bytes=params * FLOAT32_BYTES)

    def predict(self, model: Any, x: np.ndarray, batch_size: int = 256) -> np.ndarray:
        """The first output for `x`, in inference mode (dropout off, BatchNorm frozen).

        Eager calls, not model.predict: predict traces a new tf.function per model, and a
        sweep over many models triggers TensorFlow's retracing warnings.
        """
        x = np.asarray(x)
        batches = []
        for start in range(0, len(x), batch_size):
            outputs = model(x[start:start + batch_size], training=False)
            batches.append(np.asarray(outputs[0] if isinstance(outputs, (list, tuple))
                                      else outputs))
        return np.concatenate(batches)

    def prune(self, state: ModelState, config: PruneConfig, ctx: Context) -> ModelState:
        from compressor.backends.keras_optimize import pruned_model

        return state.replace(model=pruned_model(state.model, config, ctx, state.distill),
                             sparsity=config.sparsity)

    def quantize_qat(self, state: ModelState, config: QuantizeConfig, ctx: Context) -> ModelState:
        from compressor.backends.keras_optimize import quantization_aware_model

        preserve = config.preserve_sparsity and state.sparsity > 0
        model = quantization_aware_model(state.model, config, preserve, ctx, state.distill)
        return state.replace(model=model, quantize=config)

    def quantize_ptq(self, state: ModelState, config: QuantizeConfig, ctx: Context) -> ModelState:
        # The model stays float; export calibrates on `calibration_samples` training inputs.
        return state.replace(quantize=config)

    def quantizable_layers(self, state: ModelState) -> list[str]:
        """Layers int8 quantizes (conv / dense kernels): what quantize fallback may keep float."""
        from compressor.export.tflite_mixed import kernel_layer_names

        return kernel_layer_names(state.model)

    def distill(self, state: ModelState, config: DistillConfig, ctx: Context) -> ModelState:
        """Train with the KD loss; `distill` stays set so later pruning / QAT keep using it."""
        from compressor.backends.keras_distill import distilled_model

        model = distilled_model(state.model, config, state.sparsity > 0, ctx)
        return state.replace(model=model, distill=config)

    def to_precision(self, state: ModelState, config: PrecisionConfig, ctx: Context) -> ModelState:
        return state.replace(precision=config)

    def start_user_training(self, state: ModelState, step: StepConfig | None, ctx: Context,
                            steps_per_epoch: int | None = None) -> UserTraining:
        from compressor.backends.keras_user_loop import start_user_training

        return start_user_training(state, step, ctx, steps_per_epoch)

    def end_user_training(self, training: UserTraining, ctx: Context) -> ModelState:
        from compressor.backends.keras_user_loop import end_user_training

        return end_user_training(training, ctx)

    def export(self, state: ModelState, fmt: str, path: Path, ctx: Context) -> Path:
        from compressor.export import export_keras

        if state.model is None:
            raise ModelLoadError("there is no model to export; load one first")
        return export_keras(state, fmt, Path(path), ctx)

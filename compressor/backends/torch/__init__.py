"""The PyTorch backend: nn.Modules and .pt2 programs; torchao PT2E for int8, torch.onnx and
litert-torch for export.

torch is imported only by this package's modules, which the methods import when they run,
so constructing a TorchBackend (and `import compressor`) stays free. Every method works on
copies: the caller's module and files are never modified.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from compressor.backends.base import ModelInfo
from compressor.backends.torch.env import require
from compressor.errors import BackendUnavailableError, ModelLoadError
from compressor.export import FORMATS

if TYPE_CHECKING:
    from compressor.backends.base import UserTraining
    from compressor.context import Context, ModelState
    from compressor.steps import (DistillConfig, PrecisionConfig, PruneConfig, QuantizeConfig,
                                  StepConfig)

ONNX_EXAMPLE_ROWS = 2   # the dynamo exporter keeps a batch of 2+ dynamic (1 is specialized)


class TorchBackend:
    name = "torch"
    image_layout = "NCHW"

    def __init__(self) -> None:
        require("torch", "torch==2.13.0", "the PyTorch backend")

    def load(self, source: Any, *, weights: str | None = None, trust_pickle: bool = False) -> Any:
        from compressor.backends.torch.load import load_torch_model

        return load_torch_model(source, weights=weights, trust_pickle=trust_pickle)

    def clone(self, model: Any) -> Any:
        from compressor.backends.torch.load import clone_module

        return clone_module(model)

    def describe(self, model: Any, example: np.ndarray | None = None) -> ModelInfo:
        from compressor.backends.torch.infer import describe

        return describe(model, example)

    def predict(self, model: Any, x: np.ndarray, batch_size: int = 256) -> np.ndarray:
        from compressor.backends.torch.infer import predict

        return predict(model, x, batch_size)

    def prune(self, state: ModelState, config: PruneConfig, ctx: Context) -> ModelState:
        """unstructured: zeros in place (masks); channel: a smaller dense model (torch-pruning)."""
        if config.structure == "channel":
            from compressor.backends.torch.channels import channel_pruned

            return channel_pruned(state, config, ctx)
        from compressor.backends.torch.prune import pruned_model

        return state.replace(model=pruned_model(state, config, ctx))

    def quantize(self, state: ModelState, config: QuantizeConfig, ctx: Context) -> ModelState:
        """A PT2E graph whose fake-quant modules (qat, fine-tuned) or observers (ptq,
        calibrated) hold the int8 ranges; export converts it."""
        from compressor.backends.torch.quant import ptq_model, qat_model

        if config.mode in ("dynamic", "weight_only"):
            return state   # no ranges to learn: the exporters quantize the float model
        model = qat_model(state, config, ctx) if config.mode == "qat" else \
            ptq_model(state, config, ctx)
        return state.replace(model=model)

    def quantizable_layers(self, state: ModelState) -> list[str]:
        """Conv / Linear module names: what quantize fallback may keep float (set_module_name)."""
        from compressor.backends.torch.quant import kernel_module_names

        return kernel_module_names(state.model)

    def distill(self, state: ModelState, config: DistillConfig, ctx: Context) -> ModelState:
        """Train with the KD loss; the recorded step makes later pruning / QAT keep using it."""
        from compressor.backends.torch.distill import distilled_model

        return state.replace(model=distilled_model(state, config, ctx))

    def to_precision(self, state: ModelState, config: PrecisionConfig, ctx: Context) -> ModelState:
        # The model stays float32; the exporters store float16 weights behind float32 I/O.
        return state

    def export(self, state: ModelState, fmt: str, path: Path, ctx: Context) -> Path:
        from compressor.backends.torch.infer import example_input

        if state.model is None:
            raise ModelLoadError("there is no model to export; load one first")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if fmt == "onnx":
            from compressor.backends.torch.onnx import onnx_from_torch

            return onnx_from_torch(state, path, ctx, example_input(ctx, ONNX_EXAMPLE_ROWS))
        if fmt == "tflite":
            from compressor.backends.torch.tflite import tflite_from_torch

            return tflite_from_torch(state, path, ctx, example_input(ctx, 1))
        raise BackendUnavailableError(f"cannot export to {fmt!r}; the formats are "
                                      f"{', '.join(FORMATS)}")

    def start_user_training(self, state: ModelState, step: StepConfig | None, ctx: Context,
                            steps_per_epoch: int | None = None) -> UserTraining:
        from compressor.backends.torch.user_loop import start_user_training

        return start_user_training(state, step, ctx, steps_per_epoch)

    def end_user_training(self, training: UserTraining, ctx: Context) -> ModelState:
        from compressor.backends.torch.user_loop import end_user_training

        return end_user_training(training, ctx)

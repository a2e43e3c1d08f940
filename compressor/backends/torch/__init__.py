"""The PyTorch backend: nn.Modules and .pt2 programs; torchao PT2E for int8, torch.onnx and
litert-torch for export (the scheme handlers in handlers.py).

torch is imported only by this package's modules, which the methods import when they run,
so constructing a TorchBackend (and `import compressor`) stays free. Every method works on
copies: the caller's module and files are never modified.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from compressor.backends.base import ModelInfo, SchemeExporter
from compressor.backends.torch import handlers  # noqa: F401  (registers the handlers)
from compressor.backends.torch.env import require

if TYPE_CHECKING:
    from compressor.backends.base import UserTraining
    from compressor.core.context import Context, ModelState
    from compressor.config.steps import DistillConfig, PruneConfig, StepConfig


class TorchBackend(SchemeExporter):
    """Model I/O, pruning, distillation, layer selection and user loops for PyTorch; the
    schemes' apply / export handlers are in handlers.py."""

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

    def quantizable_layers(self, state: ModelState) -> list[str]:
        """Conv / Linear module names: what quantize fallback may keep float (set_module_name)."""
        from compressor.backends.torch.quant import kernel_module_names

        return kernel_module_names(state.model)

    def distill(self, state: ModelState, config: DistillConfig, ctx: Context) -> ModelState:
        """Train with the KD loss; the recorded step makes later pruning / QAT keep using it."""
        from compressor.backends.torch.distill import distilled_model

        return state.replace(model=distilled_model(state, config, ctx))

    def start_user_training(self, state: ModelState, step: StepConfig | None, ctx: Context,
                            steps_per_epoch: int | None = None) -> UserTraining:
        from compressor.backends.torch.user_loop import start_user_training

        return start_user_training(state, step, ctx, steps_per_epoch)

    def end_user_training(self, training: UserTraining, ctx: Context) -> ModelState:
        from compressor.backends.torch.user_loop import end_user_training

        return end_user_training(training, ctx)

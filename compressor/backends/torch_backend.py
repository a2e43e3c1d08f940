"""The PyTorch backend: nn.Modules and .pt2 programs; torchao PT2E for int8, litert-torch for TFLite.

torch is imported only by the torch_* helper modules, which the methods import when they run,
so constructing a TorchBackend (and `import compressor`) stays free. Every method works on
copies: the caller's module and files are never modified.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from compressor.backends.base import ModelInfo
from compressor.backends.torch_env import require
from compressor.errors import BackendUnavailableError, ModelLoadError

if TYPE_CHECKING:
    from compressor.backends.base import UserTraining
    from compressor.context import Context, ModelState
    from compressor.passes.distill import DistillConfig
    from compressor.passes.precision import PrecisionConfig
    from compressor.passes.prune import PruneConfig
    from compressor.passes.quantize import QuantizeConfig
    from compressor.registry import StepConfig

ONNX_EXAMPLE_ROWS = 2   # the dynamo exporter keeps a batch of 2+ dynamic (1 is specialized)


class TorchBackend:
    name = "torch"
    image_layout = "NCHW"

    def __init__(self) -> None:
        require("torch", "torch==2.13.0", "the PyTorch backend")

    def load(self, source: Any, *, weights: str | None = None, trust_pickle: bool = False) -> Any:
        from compressor.backends.torch_load import load_torch_model

        return load_torch_model(source, weights=weights, trust_pickle=trust_pickle)

    def save(self, model: Any, path: Path) -> Path:
        """The weights as a state_dict `.pt` (reload with the same module:function + --weights)."""
        from compressor.backends.torch_load import save_state_dict

        return save_state_dict(model, Path(path))

    def clone(self, model: Any) -> Any:
        from compressor.backends.torch_load import clone_module

        return clone_module(model)

    def describe(self, model: Any, example: np.ndarray | None = None) -> ModelInfo:
        from compressor.backends.torch_infer import describe

        return describe(model, example)

    def predict(self, model: Any, x: np.ndarray, batch_size: int = 256) -> np.ndarray:
        from compressor.backends.torch_infer import predict

        return predict(model, x, batch_size)

    def prune(self, state: ModelState, config: PruneConfig, ctx: Context) -> ModelState:
        from compressor.backends.torch_prune import pruned_model

        return state.replace(model=pruned_model(state.model, config, ctx, state.distill),
                             sparsity=config.sparsity)

    def quantize_qat(self, state: ModelState, config: QuantizeConfig, ctx: Context) -> ModelState:
        from compressor.backends.torch_quant import qat_model

        preserve = config.preserve_sparsity and state.sparsity > 0
        model = qat_model(state.model, config, preserve, ctx, state.distill)
        return state.replace(model=model, quantize=config)

    def quantize_ptq(self, state: ModelState, config: QuantizeConfig, ctx: Context) -> ModelState:
        from compressor.backends.torch_quant import ptq_model

        model = ptq_model(state.model, config, ctx, state.float_layers)
        return state.replace(model=model, quantize=config)

    def quantizable_layers(self, state: ModelState) -> list[str]:
        """Conv / Linear module names: what quantize fallback may keep float (set_module_name)."""
        from compressor.backends.torch_quant import kernel_module_names

        return kernel_module_names(state.model)

    def distill(self, state: ModelState, config: DistillConfig, ctx: Context) -> ModelState:
        """Train with the KD loss; `distill` stays set so later pruning / QAT keep using it."""
        from compressor.backends.torch_distill import distilled_model

        model = distilled_model(state.model, config, state.sparsity > 0, ctx)
        return state.replace(model=model, distill=config)

    def to_precision(self, state: ModelState, config: PrecisionConfig, ctx: Context) -> ModelState:
        # The model stays float32; the exporters store float16 weights behind float32 I/O.
        return state.replace(precision=config)

    def start_user_training(self, state: ModelState, step: StepConfig | None, ctx: Context,
                            steps_per_epoch: int | None = None) -> UserTraining:
        from compressor.backends.torch_user_loop import start_user_training

        return start_user_training(state, step, ctx, steps_per_epoch)

    def end_user_training(self, training: UserTraining, ctx: Context) -> ModelState:
        from compressor.backends.torch_user_loop import end_user_training

        return end_user_training(training, ctx)

    def export(self, state: ModelState, fmt: str, path: Path, ctx: Context) -> Path:
        from compressor.backends.torch_infer import example_input
        from compressor.export import FORMATS

        if state.model is None:
            raise ModelLoadError("there is no model to export; load one first")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if fmt == "onnx":
            from compressor.export.torch_onnx import onnx_from_torch

            written = onnx_from_torch(state, path, ctx, example_input(ctx, ONNX_EXAMPLE_ROWS))
        elif fmt == "tflite":
            from compressor.export.torch_tflite import tflite_from_torch

            written = tflite_from_torch(state, path, ctx, example_input(ctx, 1))
        else:
            raise BackendUnavailableError(f"cannot export to {fmt!r}; the formats are "
                                          f"{', '.join(FORMATS)}")
        if state.quantize is not None:
            _require_int8_kernels(written, state.quantize.mode, len(state.float_layers))
        return written


def _require_int8_kernels(path: Path, mode: str, allowed_float: int = 0) -> None:
    """Read back from the file: an "int8" artifact with float conv / linear weights is refused,
    but for the `allowed_float` layers quantize fallback keeps float on purpose."""
    from compressor.runtimes import inspect_artifact

    floats = [w.name for w in inspect_artifact(path).weights if w.is_kernel and w.dtype != "int8"]
    if len(floats) > allowed_float:
        path.unlink()
        remedy = ("try quantize mode: ptq, or a float16 precision step" if mode == "qat"
                  else "use a float16 precision step for this model instead")
        raise BackendUnavailableError(
            f"the int8 {path.suffix[1:]} artifact kept {len(floats)} conv/linear weight(s) in "
            f"float: {', '.join(floats[:5])}; these layers could not be quantized: {remedy}")

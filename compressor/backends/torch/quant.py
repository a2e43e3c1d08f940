"""int8 with torchao PT2E: QAT (prepare_qat_pt2e + fine-tuning) or PTQ (prepare_pt2e + calibration).

The state keeps the *prepared* graph, whose fake-quant modules / observers hold the learned
or calibrated ranges. `converted` turns a copy of it into the int8 q/dq graph each consumer
needs: predictions and ONNX fold the weights into int8 constants, litert-torch wants them
unfolded. Converting is cheap and deterministic, so nothing is cached.
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import torch

from compressor.backends.torch.env import import_pt2e, xnnpack_quantizer
from compressor.backends.torch.load import clone_module
from compressor.backends.torch.prune import apply_masks, kernel_parameters, zero_masks
from compressor.backends.torch.io import as_tensors, exportable
from compressor.backends.torch.train import fine_tune, graph_has_op, is_exported, set_mode
from compressor.backends.training_data import calibration_samples, training_inputs
from compressor.backends.training_rules import keeps_pruned_zeros
from compressor.core.tensors import take
from compressor.errors import BackendUnavailableError, first_line
from compressor.config.steps import DistillConfig

if TYPE_CHECKING:
    from compressor.core.context import Context, ModelState
    from compressor.schemes import Int8Scheme
    from compressor.core.tensors import Arrays
    from compressor.config.steps import QuantizeConfig

EXAMPLE_ROWS = 2          # torch.export specializes a batch of 1; 2 keeps the batch dynamic
CALIBRATION_BATCH = 32


def qat_model(state: ModelState, config: QuantizeConfig, ctx: Context) -> torch.fx.GraphModule:
    """A prepared (fake-quant) copy of the model, fine-tuned for `config.epochs` (with the
    teacher's KD loss after a distill step); pruned zeros stay zero after a prune step.
    `config` is the qat step (the Int8Qat scheme's `.training`)."""
    description = "int8 quantization-aware training"
    x, _ = training_inputs(ctx, description)
    exported = exported_for_quantization(clone_module(state.model),
                                         take(x, slice(0, EXAMPLE_ROWS)), ctx)
    # BatchNorm is folded into its conv first, so QAT fine-tunes with frozen BN statistics (a
    # common QAT practice). torchao's alternative, conv-BN QAT patterns, traces dozens of
    # pattern graphs in prepare and again in every convert: ~1.5 min per convert for a tiny
    # residual net on 2 cores, paid for the predictions and for each artifact.
    _fuse_conv_bn_(exported)
    quantizer = xnnpack_quantizer(is_qat=True,
                                  conv_bn_patterns=graph_has_op(exported, "batch_norm"))
    prepared = import_pt2e().prepare_qat_pt2e(exported, quantizer)
    if config.epochs == 0:   # no fine-tuning: the fake-quant ranges still need to see data
        calibrate(prepared, calibration_samples(ctx, config.calibration_samples), ctx)
        return prepared
    kernels = kernel_parameters(prepared)
    # Pruned weights are exactly zero; re-zeroing them after each step keeps the sparsity,
    # and symmetric int8 weights then store them as exact zeros too.
    masks = zero_masks(kernels) if keeps_pruned_zeros(state, config) else {}
    fine_tune(prepared, config, ctx, description,
              after_step=lambda step: apply_masks(kernels, masks), distill=state.last(DistillConfig),
              freeze_bn_after=config.freeze_bn_after)
    return prepared


def ptq_model(state: ModelState, scheme: Int8Scheme, ctx: Context) -> torch.fx.GraphModule:
    """A prepared copy of the model whose observers saw `scheme.calibration_samples` inputs;
    the modules named in `state.float_layers` are left unannotated, so they stay float."""
    samples = calibration_samples(ctx, scheme.calibration_samples)
    exported = exported_for_quantization(clone_module(state.model),
                                         take(samples, slice(0, EXAMPLE_ROWS)), ctx)
    quantizer = xnnpack_quantizer(is_qat=False)
    for name in state.float_layers:
        # set_module_name(name, None) asserts in torchao 0.18, but a None entry is what the
        # annotator honours: the module is skipped, and the global config excludes it.
        quantizer.module_name_config[name] = None
    prepared = import_pt2e().prepare_pt2e(exported, quantizer)
    calibrate(prepared, samples, ctx)
    return prepared


def kernel_module_names(model: torch.nn.Module) -> list[str]:
    """Names of the Conv / Linear modules (what int8 quantizes), in definition order."""
    kinds = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d,
             torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d)
    return [name for name, module in model.named_modules() if isinstance(module, kinds)]


def converted(prepared: torch.fx.GraphModule, fold_quantize: bool = True) -> torch.fx.GraphModule:
    """The int8 q/dq graph of a copy of `prepared` (which stays as it is)."""
    pt2e = import_pt2e()
    set_mode(prepared, training=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # torchao's deprecation notes, not the user's concern
        result = pt2e.convert_pt2e(clone_module(prepared), fold_quantize=fold_quantize)
    # Converted graphs refuse .eval(); the flags still say "training" to converters that check.
    for module in result.modules():
        module.training = False
    return result


def float_graph(prepared: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of `prepared` without its observers / fake-quant modules: the float graph with
    the calibrated or QAT-trained weights (BatchNorm already folded where QAT folded it), what
    the int8 ONNX route quantizes with onnxruntime's tools."""
    import_pt2e()
    from torchao.quantization.pt2e import FakeQuantizeBase, ObserverBase

    graph = clone_module(prepared)
    set_mode(graph, training=False)
    kinds = (ObserverBase, FakeQuantizeBase)
    for node in list(graph.graph.nodes):
        if node.op == "call_module" and isinstance(graph.get_submodule(node.target), kinds):
            node.replace_all_uses_with(node.args[0])
            graph.graph.erase_node(node)
    graph.delete_all_unused_submodules()
    graph.recompile()
    return graph


def is_prepared(model: torch.nn.Module) -> bool:
    """True for a PT2E graph with observers / fake-quant modules (the output of this module)."""
    if not is_exported(model):
        return False
    import_pt2e()
    from torchao.quantization.pt2e import FakeQuantizeBase, ObserverBase

    return any(isinstance(m, (ObserverBase, FakeQuantizeBase)) for m in model.modules())


def exported_for_quantization(model: torch.nn.Module, example: Arrays,
                              ctx: Context) -> torch.fx.GraphModule:
    """The eval-mode graph (BatchNorm with running statistics, no dropout), batch dynamic;
    inputs named and ordered as the original model's, outputs a flat tuple."""
    set_mode(model, training=False)
    names = [spec.name for spec in ctx.inputs] or None
    tensors = as_tensors(model, example, names)
    module = exportable(model, tensors, names or ["input"])
    try:
        program = torch.export.export(
            module, tuple(tensors), dynamic_shapes=tuple({0: torch.export.Dim.DYNAMIC}
                                                         for _ in tensors))
    except (RuntimeError, TypeError, ValueError) as exc:
        raise BackendUnavailableError(
            f"torch.export cannot capture {type(model).__name__} for int8 quantization "
            f"({first_line(exc)}); make forward() traceable (no data-dependent Python control flow) "
            "with a dynamic batch dimension, or use a float16 precision step instead") from None
    return program.module()


def _fuse_conv_bn_(graph: torch.fx.GraphModule) -> None:
    """Fold each BatchNorm that follows a conv into the conv's weight and bias, in place."""
    from torchao.quantization.pt2e.utils import _fuse_conv_bn_ as fuse   # what prepare_pt2e uses

    fuse(graph)


def calibrate(prepared: torch.fx.GraphModule, samples: Arrays, ctx: Context) -> None:
    set_mode(prepared, training=False)
    inputs = as_tensors(prepared, samples, [spec.name for spec in ctx.inputs] or None)
    with ctx.progress.task("calibrating int8", len(inputs[0])) as advance, torch.no_grad():
        for batch in zip(*(t.split(CALIBRATION_BATCH) for t in inputs)):
            prepared(*batch)
            advance(len(batch[0]))

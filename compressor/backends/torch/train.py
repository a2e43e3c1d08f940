"""The one training loop of the PyTorch backend: pruning, QAT and distillation use it.

`fine_tune` gets the model, the data loader and the optimizer from `training_setup`, the one
place that wraps them for data-parallel training: under an initialized torch.distributed
process group of 2+ ranks (torchrun; gloo on CPU) the model is DistributedDataParallel and
each rank reads its shard of the shuffled data, so gradients are averaged and every rank keeps
the same weights. Runs are deterministic under `ctx.seed`: torch's global seed and a seeded
generator (or sampler seed) for shuffling. The loop fine-tunes a trained model: the rate of
every step, the epoch kept and the early stop follow backends/fine_tuning.py (torch side in
backends/torch/epochs.py).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from compressor.backends.fine_tuning import lr_at, record_training, start_history
from compressor.backends.torch.env import configure_environment
from compressor.backends.torch.epochs import EpochJudge, freeze_batch_norm, optimizer_for, set_lr
from compressor.backends.torch.feature_distill import feature_distillation
from compressor.backends.torch.io import as_tensors, selected_output
from compressor.backends.torch.ranks import data_parallel
from compressor.backends.torch.step_memory import bf16_observers, compact_saved_tensors
from compressor.backends.training_data import training_inputs
from compressor.backends.torch.threads import on_free_cpus
from compressor.core.memory import TrainingMeter
from compressor.backends.training_rules import (CROSS_ENTROPY_ON_PROBABILITIES, MSE,
                                                PROBE_SAMPLES, ArrayOps, as_logits,
                                                outputs_probabilities, require_teacher, task_loss)
from compressor.backends.training_rules import distillation_loss as kd_loss
from compressor.errors import DataError

if TYPE_CHECKING:
    from compressor.core.context import Context
    from compressor.config.steps import DistillConfig, TrainingConfig

configure_environment()

# training_rules' array operations in PyTorch: classes on dim 1 (as in cross_entropy), the
# loss averaged over the batch.
TORCH_OPS = ArrayOps(log=torch.log, maximum=torch.clamp_min, exp=torch.exp,
                     log_softmax=lambda x: torch.nn.functional.log_softmax(x, dim=1),
                     class_sum=lambda x: x.sum(dim=1), batch_mean=torch.mean,
                     mse=torch.nn.functional.mse_loss)


@dataclass
class TrainingSetup:
    model: torch.nn.Module
    loader: torch.utils.data.DataLoader
    optimizer: torch.optim.Optimizer
    loss: Callable[..., torch.Tensor]   # loss(outputs, *targets), targets as the loader yields them
    sampler: torch.utils.data.DistributedSampler | None = None   # set_epoch() before each epoch


def is_exported(model: torch.nn.Module) -> bool:
    """A GraphModule from torch.export (a .pt2 model or a PT2E-quantized one)."""
    return isinstance(model, torch.fx.GraphModule) and any(
        "val" in node.meta for node in model.graph.nodes)


def graph_has_op(model: torch.fx.GraphModule, *fragments: str) -> bool:
    """Whether any op of the graph has one of `fragments` in its name (e.g. "batch_norm")."""
    return any(node.op == "call_function" and any(f in str(node.target) for f in fragments)
               for node in model.graph.nodes)


def set_mode(model: torch.nn.Module, training: bool) -> None:
    """model.train() / .eval(); exported graphs refuse those and swap dropout / BN ops instead."""
    if not is_exported(model):
        model.train(training)
        return
    if not graph_has_op(model, "dropout", "batch_norm"):
        return   # nothing to swap; torchao would spend seconds matching patterns to learn that
    from compressor.backends.torch.env import import_pt2e

    import_pt2e()
    from torchao.quantization.pt2e import move_exported_model_to_eval, move_exported_model_to_train

    (move_exported_model_to_train if training else move_exported_model_to_eval)(model)


def fine_tune(model: torch.nn.Module, config: TrainingConfig, ctx: Context, description: str,
              after_step: Callable[[int], None] | None = None,
              distill: DistillConfig | None = None,
              eligible: Callable[[int], bool] | None = None,
              freeze_bn_after: int | None = None) -> torch.nn.Module:
    """Fine-tune `model` in place for up to `config.epochs`; `after_step(step)` runs after
    each update.

    The loss is training_rules.task_loss's: with labels cross-entropy (on log-probabilities
    when the model ends in a softmax), without labels MSE to the model's own starting
    outputs. With `distill` it is `distillation_loss` against `ctx.teacher`'s logits. Every
    step's rate is fine_tuning.lr_at; each epoch is scored on the val split and recorded in
    the step's history; the best epoch among those `eligible(steps_so_far)` accepts is kept
    (keep_best), and early_stop ends training. BatchNorm statistics are frozen from epoch
    `freeze_bn_after` on (QAT).
    """
    x, y = training_inputs(ctx, description)
    distill = distill if distill is not None and distill.guides(config) else None
    torch.manual_seed(ctx.seed)
    inputs = as_tensors(model, x, [spec.name for spec in ctx.inputs] or None)
    setup = training_setup(model, inputs, y, config, ctx, distill)
    features = feature_distillation(model, config, ctx.teacher, inputs)   # distill feature_pairs
    if features is not None:
        setup = features.attach(setup)
    total = len(setup.loader) * config.epochs
    bf16 = _bf16(config)
    # the val split is scored in training-sized batches and, under bf16, in bf16: 64 32x32
    # images at once in float32 (QAT's graph) were the bench CNN's bf16 heap peak
    judge = EpochJudge(model, ctx, config, start_history(ctx, description), set_mode,
                       _scored_in_precision(Outputs(ctx.output_index, config.batch_size).of, bf16),
                       parallel=setup.sampler is not None)
    step = 0
    with (TrainingMeter() as meter, on_free_cpus(), compact_saved_tensors(),
          ctx.progress.task(description, total) as advance):
        for epoch in range(config.epochs):
            set_mode(model, training=True)   # the module itself: exported graphs refuse .train()
            if freeze_bn_after is not None and epoch >= freeze_bn_after:
                freeze_batch_norm(model)
            if setup.sampler is not None:
                setup.sampler.set_epoch(epoch)
            losses = []
            with bf16_observers(model, bf16):
                for batch in setup.loader:
                    set_lr(setup.optimizer, lr_at(step, total, config))
                    setup.optimizer.zero_grad(set_to_none=True)
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                        outputs = setup.model(*batch[:len(inputs)])
                        loss = setup.loss(selected_output(outputs, ctx.output_index),
                                          *batch[len(inputs):])
                    meter.mark()
                    loss.float().backward()
                    setup.optimizer.step()
                    losses.append(loss.detach())
                    step += 1
                    if after_step is not None:
                        after_step(step)
                    advance(1)
            mean_loss = float(torch.stack(losses).mean()) if losses else float("nan")
            if judge.end_epoch(epoch + 1, mean_loss, lr_at(step - 1, total, config),
                               eligible is None or eligible(step)):
                break
    record_training(ctx, description, {"steps": step, "batch_size": config.batch_size,
                                       **meter.facts(), "precision": "bf16" if bf16 else "fp32"})
    judge.restore_best()
    set_mode(model, training=False)
    if features is not None:
        features.close()   # hooks off; the projections go with them
    return model


def training_setup(model: torch.nn.Module, inputs: list[torch.Tensor], y: np.ndarray | None,
                   config: TrainingConfig, ctx: Context,
                   distill: DistillConfig | None = None) -> TrainingSetup:
    """Model, loader, optimizer and loss, created together (the place for DDP wrappers)."""
    read = Outputs(ctx.output_index)
    targets, loss = (_distillation_targets_and_loss(model, inputs, y, distill, ctx.teacher, read)
                     if distill is not None else _targets_and_loss(model, inputs, y, read))
    # One dataset of (*inputs, *targets): shuffling keeps labels and teacher logits aligned.
    dataset = torch.utils.data.TensorDataset(*inputs, *targets)
    sampler = None
    if data_parallel():
        sampler = torch.utils.data.DistributedSampler(dataset, shuffle=True, seed=ctx.seed)
        ctx.progress.info(f"data-parallel fine-tuning on {sampler.num_replicas} ranks (gloo)")
        loader = torch.utils.data.DataLoader(dataset, batch_size=config.batch_size,
                                             sampler=sampler)
    else:
        generator = torch.Generator().manual_seed(ctx.seed)
        loader = torch.utils.data.DataLoader(dataset, batch_size=config.batch_size, shuffle=True,
                                             generator=generator)
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        raise DataError("the model has no trainable parameters (requires_grad is False "
                        "everywhere); unfreeze them, or set epochs: 0")
    optimizer = optimizer_for(trainable, config)
    # DDP averages gradients in backward and broadcasts rank 0's weights and buffers first.
    trained = torch.nn.parallel.DistributedDataParallel(model) if sampler is not None else model
    return TrainingSetup(model=trained, loader=loader, optimizer=optimizer, loss=loss,
                         sampler=sampler)


def _bf16(config: TrainingConfig) -> bool:
    """precision: bf16: forward and loss under bfloat16 autocast, float32 weights (master
    copies); QAT's observers on the bfloat16 activations (step_memory.bf16_observers)."""
    return getattr(config, "precision", "fp32") == "bf16"


def _scored_in_precision(read: Callable, bf16: bool) -> Callable:
    """`read(model, inputs)` in the precision the model trains in."""
    def scored(model: torch.nn.Module, inputs: list[torch.Tensor]) -> torch.Tensor:
        with bf16_observers(model, bf16), torch.autocast("cpu", dtype=torch.bfloat16,
                                                         enabled=bf16):
            return read(model, inputs)
    return scored


@dataclass(frozen=True)
class Outputs:
    """Runs a model on lists of input tensors and reads the output losses train on."""

    index: int = 0
    batch: int = 256

    def of(self, model: torch.nn.Module, inputs: list[torch.Tensor]) -> torch.Tensor:
        """The selected output for every row, in batches, without gradients."""
        with torch.no_grad():
            return torch.cat([selected_output(model(*batch), self.index).detach()
                              for batch in zip(*(t.split(self.batch) for t in inputs))])

    def probe(self, model: torch.nn.Module, inputs: list[torch.Tensor]) -> torch.Tensor:
        with torch.no_grad():
            return selected_output(model(*(t[:PROBE_SAMPLES] for t in inputs)), self.index)


def _targets_and_loss(model: torch.nn.Module, inputs: list[torch.Tensor], y: np.ndarray | None,
                      read: Outputs):
    set_mode(model, training=False)
    kind = task_loss(y is not None, lambda: _outputs_probabilities(read.probe(model, inputs)))
    if kind == MSE:
        return (read.of(model, inputs),), torch.nn.functional.mse_loss
    labels = torch.from_numpy(np.asarray(y, dtype=np.int64))
    if kind == CROSS_ENTROPY_ON_PROBABILITIES:
        return (labels,), lambda probs, target: torch.nn.functional.nll_loss(
            as_logits(TORCH_OPS, probs, True), target)
    return (labels,), torch.nn.functional.cross_entropy


def distillation_loss(config: DistillConfig, hard_loss: Callable | None,
                      student_probabilities: bool) -> Callable[..., torch.Tensor]:
    """training_rules.distillation_loss as loss(outputs, labels, teacher_logits), or
    loss(outputs, teacher_logits) when there are no labels (`hard_loss` None);
    `hard_loss(outputs, labels)`. Classes are dim 1, as in cross_entropy."""
    rule = kd_loss(TORCH_OPS, config, hard_loss, student_probabilities)

    def loss(outputs: torch.Tensor, *targets: torch.Tensor) -> torch.Tensor:
        return rule(outputs, targets[-1], targets[0] if hard_loss is not None else None)

    return loss


def teacher_logits(teacher: torch.nn.Module, inputs: list[torch.Tensor],
                   read: Outputs = Outputs()) -> torch.Tensor:
    """The frozen teacher's logits for `inputs`, once, in inference mode (log of probabilities)."""
    require_teacher(teacher)
    set_mode(teacher, training=False)
    logits = read.of(teacher, inputs).float()
    return as_logits(TORCH_OPS, logits, _outputs_probabilities(read.probe(teacher, inputs)))


def _distillation_targets_and_loss(model: torch.nn.Module, inputs: list[torch.Tensor],
                                   y: np.ndarray | None, config: DistillConfig,
                                   teacher: torch.nn.Module, read: Outputs):
    soft = teacher_logits(teacher, inputs, read)
    set_mode(model, training=False)
    student_probabilities = _outputs_probabilities(read.probe(model, inputs))
    if y is None:   # the teacher term alone
        return (soft,), distillation_loss(config, None, student_probabilities)
    (labels,), hard_loss = _targets_and_loss(model, inputs, y, read)
    return (labels, soft), distillation_loss(config, hard_loss, student_probabilities)


def _outputs_probabilities(out: torch.Tensor) -> bool:
    """training_rules.outputs_probabilities of a probe's outputs (classes on dim 1)."""
    return outputs_probabilities(out.detach().float().cpu().numpy(), class_axis=1)

"""Rules both backends' training loops follow, written once. Framework-neutral: numpy only.

- The distillation policy: the KD loss `distillation_loss`, alpha * T^2 *
  KL(softmax(t/T) || softmax(s/T)) + (1 - alpha) * hard loss, written against `ArrayOps`, the
  few array operations each backend fills with its framework's own (keras/train.py,
  torch/train.py; `NUMPY_OPS` here); whether a model's outputs are probabilities, whose log
  then stands in for logits (`outputs_probabilities`, `as_logits`); which loss labels train
  (`task_loss`).
- Keep-pruned-zeros: whether a training step after a prune step keeps its zeros at zero
  (`keeps_pruned_zeros`), the one question QAT and distillation ask in both backends.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from compressor.errors import RecipeError
from compressor.config.steps import DistillConfig, PruneConfig, QuantizeConfig

if TYPE_CHECKING:
    from compressor.core.context import ModelState
    from compressor.config.steps import StepConfig

PROBE_SAMPLES = 64   # how many inputs decide whether a model outputs probabilities or logits
LOG_FLOOR = 1e-12    # probabilities are clamped to this before their log is taken

# What `task_loss` answers: the loss a training step's labels (or their absence) call for.
MSE = "mse"                                  # no labels: learn the reference's outputs
CROSS_ENTROPY_ON_LOGITS = "logits"           # labels; the model outputs logits
CROSS_ENTROPY_ON_PROBABILITIES = "probabilities"   # labels; the model ends in a softmax


@dataclass(frozen=True)
class ArrayOps:
    """The array operations the distillation loss is written in, in one framework.

    Arithmetic (+, -, *, / by a float) is the arrays' own. The class axis is the backend's
    (Keras: last, PyTorch: 1, as cross_entropy has it); `batch_mean` is the reduction over
    samples the framework expects of a loss function (identity where Keras reduces per-sample
    losses itself); `mse` is the framework's mean squared error, reduced the same way.
    """

    log: Callable[[Any], Any]
    maximum: Callable[[Any, float], Any]   # elementwise max with a scalar floor
    exp: Callable[[Any], Any]
    log_softmax: Callable[[Any], Any]      # along the class axis
    class_sum: Callable[[Any], Any]        # sum along the class axis
    batch_mean: Callable[[Any], Any]
    mse: Callable[[Any, Any], Any]


def _numpy_log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


NUMPY_OPS = ArrayOps(log=np.log, maximum=np.maximum, exp=np.exp, log_softmax=_numpy_log_softmax,
                     class_sum=lambda x: x.sum(axis=-1), batch_mean=np.mean,
                     mse=lambda a, b: np.mean(np.square(a - b)))


def outputs_probabilities(out: np.ndarray, class_axis: int = -1) -> bool:
    """True when the model ends in a softmax: outputs in [0, 1] whose rows sum to 1 (a probe
    of PROBE_SAMPLES rows decides it)."""
    if out.ndim < 2 or out.shape[class_axis] < 2:
        return False
    return bool(out.min() >= 0.0 and out.max() <= 1.0
                and np.allclose(out.sum(axis=class_axis), 1.0, atol=1e-3))


def as_logits(ops: ArrayOps, out: Any, probabilities: bool) -> Any:
    """What the KD loss reads as logits: `out` itself, or the log of probabilities."""
    return ops.log(ops.maximum(out, LOG_FLOOR)) if probabilities else out


def require_teacher(teacher: Any) -> None:
    if teacher is None:
        raise RecipeError("distillation needs a teacher model; pass --teacher MODEL "
                          "(or teacher=... in Python)")


def task_loss(labelled: bool, probabilities: Callable[[], bool]) -> str:
    """The loss of a training step without a teacher (and the hard term of one with it):
    without labels MSE to the reference model's own outputs (no labels may mean regression;
    it keeps the model close to the original while masks or fake-quant change it); with
    labels cross-entropy, on the log of the outputs when `probabilities()` (the probe, only
    run when there are labels) says the model ends in a softmax."""
    if not labelled:
        return MSE
    return CROSS_ENTROPY_ON_PROBABILITIES if probabilities() else CROSS_ENTROPY_ON_LOGITS


def distillation_loss(ops: ArrayOps, config: DistillConfig, hard_loss: Callable | None,
                      student_probabilities: bool) -> Callable[..., Any]:
    """loss(outputs, teacher_logits, labels): alpha * T^2 * KL(softmax(t/T) || softmax(s/T))
    + (1 - alpha) * hard_loss(outputs, labels).

    Without labels (`hard_loss` None) the loss is the teacher term only, as MSE on logits (no
    labels may mean regression). `loss: mse` swaps the KL for MSE on logits. A student that
    outputs probabilities is compared through their log.
    """
    temperature, alpha = config.temperature, config.alpha
    kind = config.loss if hard_loss is not None else "mse"

    def loss(outputs: Any, teacher: Any, labels: Any = None) -> Any:
        student = as_logits(ops, outputs, student_probabilities)
        if kind == "kl":
            soft_targets = ops.log_softmax(teacher / temperature)
            soft_student = ops.log_softmax(student / temperature)
            term = temperature ** 2 * ops.batch_mean(ops.class_sum(
                ops.exp(soft_targets) * (soft_targets - soft_student)))
        else:
            term = ops.mse(student, teacher)
        if hard_loss is None:
            return term
        return alpha * term + (1.0 - alpha) * hard_loss(outputs, labels)

    return loss


def keeps_pruned_zeros(state: ModelState, step: StepConfig) -> bool:
    """Whether training `step` re-zeroes the weights an earlier prune step zeroed.

    QAT (a quantize step) keeps them when the last prune step zeroed single weights
    (structure: unstructured) and `preserve_sparsity` is on (the default). Distillation keeps
    every kernel's zeros after any prune step (after channel pruning, the zeros of an earlier
    unstructured prune step, if any). Other steps, and any step before a prune step: no.
    """
    prune = state.last(PruneConfig)
    if prune is None:
        return False
    if isinstance(step, QuantizeConfig):
        return step.preserve_sparsity and prune.leaves_zeros
    return isinstance(step, DistillConfig)

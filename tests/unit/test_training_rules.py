"""compressor/backends/training_rules.py: the distillation loss written once against array ops
(evaluated here through numpy), the probabilities / logits decision, the task loss and the
keep-pruned-zeros rule. numpy only."""
from __future__ import annotations

import numpy as np
import pytest

from compressor.backends.training_rules import (CROSS_ENTROPY_ON_LOGITS,
                                                CROSS_ENTROPY_ON_PROBABILITIES, MSE, NUMPY_OPS,
                                                as_logits, distillation_loss, keeps_pruned_zeros,
                                                outputs_probabilities, require_teacher, task_loss)
from compressor.core.context import ModelState
from compressor.errors import RecipeError
from compressor.config.steps import DistillConfig, PrecisionConfig, PruneConfig, QuantizeConfig

RNG = np.random.default_rng(0)
STUDENT = RNG.normal(size=(16, 10)) * 3.0
TEACHER = RNG.normal(size=(16, 10)) * 3.0
LABELS = RNG.integers(0, 10, size=16)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _cross_entropy(outputs: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(-np.log(_softmax(outputs)[np.arange(len(labels)), labels])))


def _direct_kl(student: np.ndarray, teacher: np.ndarray, temperature: float) -> float:
    """T^2 * mean over samples of KL(softmax(t/T) || softmax(s/T)), written out."""
    p, q = _softmax(teacher / temperature), _softmax(student / temperature)
    return temperature ** 2 * float(np.mean(np.sum(p * (np.log(p) - np.log(q)), axis=-1)))


@pytest.mark.parametrize("temperature, alpha", [(1.0, 0.5), (2.0, 0.7), (4.0, 1.0), (3.0, 0.0)])
def test_kl_distillation_loss_through_numpy_ops_is_the_written_out_formula(temperature, alpha):
    config = DistillConfig(temperature=temperature, alpha=alpha)
    loss = distillation_loss(NUMPY_OPS, config, _cross_entropy, False)
    expected = (alpha * _direct_kl(STUDENT, TEACHER, temperature)
                + (1 - alpha) * _cross_entropy(STUDENT, LABELS))
    assert float(loss(STUDENT, TEACHER, LABELS)) == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_the_kl_term_is_zero_when_the_student_matches_the_teacher():
    loss = distillation_loss(NUMPY_OPS, DistillConfig(alpha=1.0), _cross_entropy, False)
    assert float(loss(TEACHER, TEACHER, LABELS)) == pytest.approx(0.0, abs=1e-12)


def test_mse_distillation_loss_is_mse_on_logits_plus_the_hard_term():
    config = DistillConfig(loss="mse", alpha=0.7)
    loss = distillation_loss(NUMPY_OPS, config, _cross_entropy, False)
    expected = (0.7 * float(np.mean((STUDENT - TEACHER) ** 2))
                + 0.3 * _cross_entropy(STUDENT, LABELS))
    assert float(loss(STUDENT, TEACHER, LABELS)) == pytest.approx(expected, rel=1e-12)


def test_without_labels_the_loss_is_the_teacher_term_as_mse_on_logits():
    """No labels may mean regression: KL is not used even when the recipe says kl."""
    loss = distillation_loss(NUMPY_OPS, DistillConfig(loss="kl", alpha=0.7), None, False)
    assert float(loss(STUDENT, TEACHER)) == pytest.approx(float(np.mean((STUDENT - TEACHER) ** 2)),
                                                          rel=1e-12)


def test_a_softmax_student_is_compared_through_the_log_of_its_probabilities():
    probabilities = _softmax(STUDENT)
    config = DistillConfig(temperature=2.0, alpha=1.0)
    from_probabilities = distillation_loss(NUMPY_OPS, config, _cross_entropy, True)
    from_logits = distillation_loss(NUMPY_OPS, config, _cross_entropy, False)
    assert float(from_probabilities(probabilities, TEACHER, LABELS)) == pytest.approx(
        float(from_logits(STUDENT, TEACHER, LABELS)), rel=1e-9)


def test_the_hard_loss_sees_the_raw_outputs_and_the_labels():
    seen = []
    loss = distillation_loss(NUMPY_OPS, DistillConfig(),
                             lambda out, y: seen.append((out, y)) or 0.0, True)
    probabilities = _softmax(STUDENT)
    loss(probabilities, TEACHER, LABELS)
    assert seen[0][0] is probabilities and seen[0][1] is LABELS


def test_outputs_probabilities_along_the_class_axis():
    probabilities = _softmax(STUDENT)
    assert outputs_probabilities(probabilities)
    assert not outputs_probabilities(STUDENT)
    assert not outputs_probabilities(probabilities[:, :1])            # one column: not a softmax
    assert not outputs_probabilities(probabilities[0])                # no batch axis
    assert not outputs_probabilities(probabilities * 0.5)             # rows do not sum to 1
    channels_first = probabilities.reshape(4, 4, 10).transpose(0, 2, 1)   # (N, classes, positions)
    assert outputs_probabilities(channels_first, class_axis=1)
    assert not outputs_probabilities(channels_first, class_axis=-1)


def test_as_logits_takes_the_clamped_log_of_probabilities_only():
    probabilities = np.array([[0.0, 0.25, 0.75]])
    np.testing.assert_array_equal(as_logits(NUMPY_OPS, probabilities, True),
                                  np.log(np.maximum(probabilities, 1e-12)))
    assert as_logits(NUMPY_OPS, STUDENT, False) is STUDENT


def test_task_loss_probes_only_with_labels():
    def probe():
        raise AssertionError("no labels: the probe must not run")

    assert task_loss(False, probe) == MSE
    assert task_loss(True, lambda: True) == CROSS_ENTROPY_ON_PROBABILITIES
    assert task_loss(True, lambda: False) == CROSS_ENTROPY_ON_LOGITS


def test_distillation_needs_a_teacher():
    with pytest.raises(RecipeError, match="--teacher MODEL"):
        require_teacher(None)
    require_teacher(object())


UNSTRUCTURED = PruneConfig(sparsity=0.3)
CHANNELS = PruneConfig(sparsity=0.3, structure="channel")


@pytest.mark.parametrize("steps, step, keeps", [
    ((UNSTRUCTURED,), QuantizeConfig(), True),                      # preserve_sparsity by default
    ((UNSTRUCTURED,), QuantizeConfig(preserve_sparsity=False), False),
    ((CHANNELS,), QuantizeConfig(), False),                         # channels leave no zeros
    ((UNSTRUCTURED, CHANNELS), QuantizeConfig(), False),            # the last prune step decides
    ((), QuantizeConfig(), False),
    ((UNSTRUCTURED,), DistillConfig(), True),
    ((CHANNELS,), DistillConfig(), True),                           # distill keeps any zeros left
    ((), DistillConfig(), False),
    ((DistillConfig(),), DistillConfig(), False),
    ((UNSTRUCTURED,), PrecisionConfig(), False),
])
def test_keeps_pruned_zeros(steps, step, keeps):
    state = ModelState(model=None, steps=steps)
    assert keeps_pruned_zeros(state, step) is keeps

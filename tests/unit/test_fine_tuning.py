"""compressor/backends/fine_tuning.py: the learning rate at each step, the val metric an epoch is
judged by, and the history that keeps the best epoch and stops early. numpy only."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from compressor.backends.fine_tuning import (EpochRecord, TrainingHistory, lr_at, peak_lr,
                                             val_score, val_targets)
from compressor.config.steps import DistillConfig, PruneConfig, QuantizeConfig


@pytest.mark.parametrize("config, peak", [
    (QuantizeConfig(), 3e-4),                       # adam: 3/10 of 1e-3
    (QuantizeConfig(optimizer="adamw"), 3e-4),
    (QuantizeConfig(optimizer="sgd"), 3e-3),        # 3/10 of 1e-2
    (PruneConfig(sparsity=0.3), 3e-4),
    (DistillConfig(), 1e-3),                        # distillation: the from-scratch rate
    (DistillConfig(optimizer="sgd"), 1e-2),
    (QuantizeConfig(lr=0.05), 0.05),                # the recipe's own lr wins
])
def test_peak_lr(config, peak):
    assert peak_lr(config) == pytest.approx(peak)


def test_warmup_then_cosine_decay_to_zero():
    config = QuantizeConfig(lr=1.0, warmup=0.1)      # 10 warmup steps of 100
    rates = [lr_at(step, 100, config) for step in range(100)]
    assert rates[0] == pytest.approx(0.1)
    assert rates[4] == pytest.approx(0.5)
    assert rates[9] == rates[10] == pytest.approx(1.0)   # warmup ends at the peak
    assert rates[55] == pytest.approx(0.5)                # half-way through the decay
    assert rates[99] == pytest.approx(0.5 * (1 + math.cos(math.pi * 89 / 90)))
    assert rates[99] < 1e-3
    assert all(a <= b for a, b in zip(rates[:10], rates[1:11]))     # rising warmup
    assert all(a >= b for a, b in zip(rates[10:], rates[11:]))      # falling decay
    assert max(rates) == pytest.approx(1.0)
    assert lr_at(150, 100, config) == pytest.approx(0.0)             # past the end: 0, not negative


def test_no_warmup_starts_at_the_peak():
    config = QuantizeConfig(lr=2.0, warmup=0.0)
    assert lr_at(0, 10, config) == pytest.approx(2.0)
    assert lr_at(5, 10, config) == pytest.approx(1.0)   # progress 5/10 of the cosine


def test_constant_schedule_and_single_step_keep_the_peak():
    constant = QuantizeConfig(lr=0.01, lr_schedule="constant")
    assert [lr_at(step, 50, constant) for step in (0, 25, 49)] == [0.01, 0.01, 0.01]
    assert lr_at(0, 1, QuantizeConfig(lr=0.01)) == 0.01


def test_prune_steps_read_lr_schedule_not_the_sparsity_schedule():
    config = PruneConfig(sparsity=0.3, schedule="polynomial", lr_schedule="constant", lr=0.1)
    assert lr_at(7, 10, config) == 0.1


def test_val_score_is_accuracy_with_labels():
    outputs = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]])
    assert val_score(outputs, np.array([1, 0, 0]), None) == ("accuracy", pytest.approx(2 / 3))


def test_val_score_is_negative_mse_to_the_reference_without_labels():
    outputs = np.array([[1.0, 2.0], [0.0, 0.0]])
    reference = np.array([[1.0, 4.0], [0.0, 2.0]])
    assert val_score(outputs, None, reference) == ("neg_mse", pytest.approx(-2.0))  # (4 + 4) / 4


def test_val_score_on_a_single_column_uses_the_reference_even_with_labels():
    outputs, reference = np.array([[0.5], [1.5]]), np.array([[0.0], [1.5]])
    assert val_score(outputs, np.array([0, 1]), reference) == ("neg_mse", pytest.approx(-0.125))
    assert val_score(outputs, np.array([0, 1]), None) is None


def _history(values, eligible=None) -> tuple[TrainingHistory, list[bool]]:
    history = TrainingHistory(step="prune", metric="accuracy")
    eligible = eligible or [True] * len(values)
    best = [history.record(EpochRecord(epoch=i + 1, loss=1.0 / (i + 1), lr=1e-3, val_metric=v), ok)
            for i, (v, ok) in enumerate(zip(values, eligible))]
    return history, best


def test_history_keeps_the_first_best_epoch():
    history, best = _history([0.5, 0.7, 0.6, 0.7])
    assert best == [True, True, False, False]      # a tie does not replace the earlier epoch
    assert (history.best_epoch, history.best_value) == (2, 0.7)


def test_ineligible_or_unscored_epochs_are_never_best():
    history, best = _history([0.5, 0.9, None, 0.6], eligible=[True, False, True, True])
    assert best == [True, False, False, True]
    assert (history.best_epoch, history.best_value) == (4, 0.6)


def test_history_without_scores_has_no_best():
    history, best = _history([None, None])
    assert best == [False, False] and history.best_epoch is None and history.best_value is None
    assert not history.should_stop(1)               # nothing to stop for


def test_early_stop_after_patience_epochs_without_a_better_one():
    history, _ = _history([0.5, 0.8, 0.7])
    assert not history.should_stop(2) and not history.stopped_early   # 1 epoch since the best
    history.record(EpochRecord(epoch=4, loss=0.1, lr=1e-4, val_metric=0.75))
    assert history.should_stop(2) and history.stopped_early
    assert not history.should_stop(None)


def test_history_as_dict_rounds_for_the_report():
    history, _ = _history([0.12345678, None])
    assert history.as_dict() == {
        "step": "prune", "metric": "accuracy", "best_epoch": 1, "stopped_early": False,
        "epochs": [{"epoch": 1, "loss": 1.0, "lr": 1e-3, "val_metric": 0.123457},
                   {"epoch": 2, "loss": 0.5, "lr": 1e-3, "val_metric": None}]}


def test_val_targets_pick_the_selected_output_of_the_reference():
    labels = np.array([1, 0])
    reference = {"aux": np.zeros((2, 2)), "logits": np.ones((2, 3))}
    ctx = SimpleNamespace(data=SimpleNamespace(val=(np.zeros((2, 4)), labels)),
                          reference_outputs=reference, output_index=1)
    got_labels, got_reference = val_targets(ctx)
    assert got_labels.tolist() == [1, 0] and got_reference.shape == (2, 3)
    ctx.output_index = 7                              # past the end: the last output
    assert val_targets(ctx)[1].shape == (2, 3)


def test_val_targets_without_val_labels_or_reference():
    ctx = SimpleNamespace(data=SimpleNamespace(val=None), reference_outputs=None, output_index=0)
    assert val_targets(ctx) == (None, None)
    ctx = SimpleNamespace(data=SimpleNamespace(val=(np.zeros((2, 4)), None)),
                          reference_outputs=np.ones((2, 5)), output_index=0)
    labels, reference = val_targets(ctx)
    assert labels is None and reference.shape == (2, 5)

"""keep_best / early_stop for a language model's training (lm_epochs.py): the windows held back
to judge each epoch, the best epoch's weights put back, and an early stop."""
from __future__ import annotations

import numpy as np
import torch

from compressor.backends.fine_tuning import TrainingHistory
from compressor.backends.llm.lm_epochs import VAL_SHARE, EpochJudge, held_back
from compressor.config.steps import QuantizeConfig


def _config(**keys):
    return QuantizeConfig(**{"mode": "qat", "dtype": "int4", **keys})


def test_one_window_in_sixteen_is_held_back_only_when_an_epoch_is_judged():
    windows = np.arange(121 * 4).reshape(121, 4)
    train, val = held_back(windows, _config())
    assert len(val) == 121 // VAL_SHARE == 7 and len(train) == 114
    assert np.array_equal(val, windows[-7:]) and np.array_equal(train, windows[:-7])
    train, val = held_back(windows, _config(keep_best=False))
    assert len(val) == 0 and len(train) == 121
    train, val = held_back(windows[:15], _config())       # too short to spare one
    assert len(val) == 0 and len(train) == 15


def test_the_best_epoch_is_put_back_and_recorded():
    weight = torch.nn.Parameter(torch.zeros(3))
    target = torch.tensor([1.0, 2.0, 3.0])
    history = TrainingHistory(step="int4 QAT")

    def loss_of(ids: torch.Tensor) -> torch.Tensor:     # the val windows' "loss": distance
        return ((weight - target) ** 2).sum() + 0 * ids.sum()

    judge = EpochJudge(np.zeros((4, 8), np.int64), 2, loss_of, [weight], _config(early_stop=1),
                       history)
    with torch.no_grad():
        weight.copy_(torch.tensor([1.0, 2.0, 2.5]))      # epoch 1: loss 0.25
    assert not judge.end_epoch(1, loss=0.9, lr=1e-4)
    with torch.no_grad():
        weight.copy_(torch.tensor([0.0, 0.0, 0.0]))      # epoch 2: loss 14, worse
    assert judge.end_epoch(2, loss=0.8, lr=5e-5)         # patience 1: stop
    judge.restore_best()
    assert torch.equal(weight.detach(), torch.tensor([1.0, 2.0, 2.5]))
    record = history.as_dict()
    assert record["metric"] == "neg_val_loss" and record["best_epoch"] == 1
    assert record["stopped_early"] is True
    assert [e["val_metric"] for e in record["epochs"]] == [-0.25, -14.0]
    assert not judge._best.exists()                      # the snapshot's folder is gone


def test_the_last_epoch_kept_is_left_as_it_is():
    weight = torch.nn.Parameter(torch.ones(2))
    judge = EpochJudge(np.zeros((2, 4), np.int64), 2, lambda ids: weight.sum() * 0 + 1.0,
                       [weight], _config(keep_best=False), None)
    judge.end_epoch(1, loss=1.0, lr=1e-4)
    with torch.no_grad():
        weight.fill_(5.0)
    judge.end_epoch(2, loss=1.0, lr=1e-4)
    judge.restore_best()
    assert torch.equal(weight.detach(), torch.full((2,), 5.0))

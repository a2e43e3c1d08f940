"""The PyTorch training loop's fine-tuning behaviour (issue 15), on a small MLP over the real
digits split: every step's rate is fine_tuning.lr_at, each epoch is scored on the val split
and recorded, the best epoch's weights are what the loop returns, early_stop ends it, a run
without val data keeps the last epoch, and QAT's BatchNorm freezing stops an exported
graph's statistics from moving."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from compressor.backends.fine_tuning import lr_at
from compressor.backends.torch.epochs import freeze_batch_norm
from compressor.backends.torch.train import fine_tune, set_mode
from compressor.core.context import Context, Data
from compressor.tasks.array.data import digits
from compressor.core.progress import Progress
from compressor.config.steps import TrainingConfig

pytestmark = pytest.mark.slow   # ~70 s on 2 busy cores, most of it importing torch / torchao


@pytest.fixture(scope="module")
def flat_digits() -> Data:
    data = digits("NCHW")
    (x, y), (xv, yv) = data.train, data.val
    return Data(train=(x.reshape(len(x), -1), y), val=(xv.reshape(len(xv), -1), yv))


def mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.BatchNorm1d(32),
                               torch.nn.ReLU(), torch.nn.Linear(32, 10))


def run(data: Data, tmp_path, **config):
    ctx = Context(data=data, progress=Progress(quiet=True), workdir=tmp_path)
    # The keys every training step shares, with the fine-tuning default rate (a distill step
    # defaults to the from-scratch rate instead).
    config = TrainingConfig(**config)
    model = fine_tune(mlp(), config, ctx, "fine-tuning")
    return model, config, ctx.record.histories[0]


def val_accuracy(model: torch.nn.Module, data: Data) -> float:
    with torch.no_grad():
        outputs = model(torch.from_numpy(data.val[0])).numpy()
    return float(np.mean(outputs.argmax(-1) == data.val[1]))


def test_each_epoch_is_recorded_at_the_schedules_rate(flat_digits, tmp_path):
    model, config, history = run(flat_digits, tmp_path, epochs=3)
    steps_per_epoch = -(-len(flat_digits.train[1]) // config.batch_size)
    total = 3 * steps_per_epoch
    assert [e.epoch for e in history.epochs] == [1, 2, 3]
    assert [e.lr for e in history.epochs] == [lr_at(k * steps_per_epoch - 1, total, config)
                                             for k in (1, 2, 3)]
    assert history.epochs[-1].lr < 1e-6 < history.epochs[0].lr <= 3e-4   # cosine to 0 from 3e-4
    assert history.metric == "accuracy" and history.best_epoch is not None
    # What the loop returns scores what the history says the kept epoch scored.
    assert val_accuracy(model, flat_digits) == pytest.approx(history.best_value, abs=1e-9)


def test_the_best_epoch_is_kept_and_early_stop_ends_training(flat_digits, tmp_path):
    # SGD at a rate far too high: accuracy peaks early and then falls apart.
    model, _, history = run(flat_digits, tmp_path, epochs=6, optimizer="sgd", lr=5.0,
                            schedule="constant", early_stop=2)
    scores = [e.val_metric for e in history.epochs]
    assert history.stopped_early and len(scores) < 6
    assert history.best_epoch == int(np.argmax(scores)) + 1 < len(scores)
    assert val_accuracy(model, flat_digits) == pytest.approx(max(scores), abs=1e-9)
    assert history.as_dict()["stopped_early"] is True


def test_without_val_data_the_last_epoch_is_kept(flat_digits, tmp_path):
    data = Data(train=flat_digits.train)
    _, _, history = run(data, tmp_path, epochs=2)
    assert [e.val_metric for e in history.epochs] == [None, None]
    assert history.best_epoch is None and all(e.loss > 0 for e in history.epochs)


def test_frozen_batch_norm_keeps_an_exported_graphs_statistics(flat_digits):
    model = mlp().eval()
    x = torch.from_numpy(flat_digits.train[0][:64]) * 3.0 + 1.0   # not the stored statistics
    graph = torch.export.export(model, (x,)).module()
    set_mode(graph, training=True)
    before = {k: v.clone() for k, v in graph.state_dict().items() if "running" in k}
    graph(x)
    moved = {k: v.clone() for k, v in graph.state_dict().items() if "running" in k}
    assert any(not torch.equal(before[k], moved[k]) for k in before)   # train mode updates them
    freeze_batch_norm(graph)
    graph(x)
    assert all(torch.equal(moved[k], v) for k, v in graph.state_dict().items() if "running" in k)

"""PyTorch `structure: channel` beyond CNNs: Hugging Face style attention loses whole heads
(torch-pruning, told each q / k / v projection's head count), the feed-forward hidden units
go, and every tensor the model returns keeps its width (a BertModel returns its residual
stream, so that group stays whole). Tiny random-init or seconds-trained BERTs."""
from __future__ import annotations

import numpy as np
import pytest

import compressor as cz
from compressor.backends import get_backend
from compressor.core.context import ModelState
from compressor.tasks.array.data import digits
from compressor.config.steps import PruneConfig

from support import helpers
from support.io_models import bert_inputs, tiny_bert, token_data

CHANNELS50 = ("extends: channels50\nname: channels50_test\nsteps:\n  - pass: prune\n"
              "    structure: channel\n    sparsity: 0.5\n    epochs: 4\n    lr: 0.003\n")


def _pruned(model, data, tmp_path, **options):
    options = {"sparsity": 0.5, "structure": "channel", "epochs": 0, **options}
    ctx = helpers.context(data, tmp_path)
    state = helpers.apply(get_backend("torch"), ModelState(model), PruneConfig(**options),
                          ctx)
    (section,) = ctx.record.sections   # channel_pruning
    return state, section


def _bert_data():
    inputs = bert_inputs(32)
    return cz.Data(train=(inputs, None), val=(bert_inputs(16, seed=1), None), name="bert")


def _outputs(model, inputs: dict):
    import torch

    with torch.no_grad():
        out = model(**{k: torch.as_tensor(v) for k, v in inputs.items()})
    return out.last_hidden_state.numpy(), out.pooler_output.numpy()


def _with_dead_heads(model):
    """Zero head 1 of every layer (its q / k / v rows, the output projection's columns) and
    the upper half of every feed-forward hidden layer (rows and the next layer's columns)."""
    import torch

    with torch.no_grad():
        for layer in model.encoder.layer:
            attention, size = layer.attention.self, layer.attention.self.attention_head_size
            for linear in (attention.query, attention.key, attention.value):
                linear.weight[size:], linear.bias[size:] = 0.0, 0.0
            layer.attention.output.dense.weight[:, size:] = 0.0
            hidden = layer.intermediate.dense.out_features // 2
            layer.intermediate.dense.weight[hidden:], layer.intermediate.dense.bias[hidden:] = 0, 0
            layer.output.dense.weight[:, hidden:] = 0.0
    return model


def test_dead_heads_and_hidden_units_are_removed_exactly(tmp_path):
    """A BertModel returns (last_hidden_state, pooler_output): both keep their widths, each
    layer loses exactly its dead head and dead hidden units, and the outputs do not change."""
    model = _with_dead_heads(tiny_bert())
    inputs = bert_inputs(8, seed=2)
    before = _outputs(model, inputs)
    state, section = _pruned(model, _bert_data(), tmp_path)
    after = _outputs(state.model, inputs)
    for old, new in zip(before, after):
        assert new.shape == old.shape
        np.testing.assert_allclose(new, old, atol=1e-5)
    report = section.report({})
    assert report["attention_heads"] == [
        {"layer": f"encoder.layer.{i}.attention.self", "before": 2, "after": 1} for i in (0, 1)]
    for layer in state.model.encoder.layer:
        assert layer.attention.self.query.out_features == 16
        assert layer.attention.self.num_attention_heads == 1
        assert layer.attention.self.all_head_size == 16
        assert layer.intermediate.dense.out_features == 32
    kept = {name for entry in report["kept_whole"] for name in entry["layers"]}
    assert kept == {"pooler.dense", "encoder.layer.1.output.LayerNorm"}, report["kept_whole"]


def test_a_module_that_makes_an_output_keeps_its_channels(tmp_path):
    """Not only the last Linear: a model returning an inner feature map as a second output
    keeps that map's channels (the conv that makes it is left whole)."""
    import torch
    from torch import nn

    class FeaturesAndLogits(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv_a, self.conv_b = nn.Conv2d(1, 16, 3, padding=1), nn.Conv2d(16, 32, 3, padding=1)
            self.head = nn.Linear(32, 10)

        def forward(self, x):
            features = torch.relu(self.conv_a(x))
            pooled = torch.relu(self.conv_b(features)).mean(dim=(2, 3))
            return self.head(pooled), features

    torch.manual_seed(0)
    data = digits("NCHW")
    state, section = _pruned(FeaturesAndLogits().eval(), data, tmp_path)
    kept = {name for entry in section.report({})["kept_whole"] for name in entry["layers"]}
    assert kept == {"head", "conv_a"}
    assert state.model.conv_a.out_channels == 16 and state.model.conv_b.out_channels == 16
    logits, features = state.model(torch.as_tensor(data.val[0][:4]))
    assert logits.shape == (4, 10) and features.shape == (4, 16, 8, 8)


@pytest.mark.slow
def test_channels50_on_a_bert_classifier_exports_the_smaller_model(tmp_path):
    """A 2-layer BertForSequenceClassification trained for seconds on token ids: channels50
    halves its heads and hidden units, fine-tunes, and the ONNX file reads back smaller."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from support.io_models import _torch_trained

    torch.manual_seed(0)
    config = BertConfig(vocab_size=20, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=16, num_labels=2,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    data = token_data()
    model = _torch_trained(BertForSequenceClassification(config), data, 20,
                           lambda out: out.logits, lr=2e-3)
    recipe = tmp_path / "channels50_test.yaml"
    recipe.write_text(CHANNELS50)
    result = cz.compress(model, str(recipe), data, out_dir=tmp_path / "out", formats=("onnx",),
                         latency=False, quiet=True)
    art, channels = result.report["artifacts"][0], result.report["channel_pruning"]
    assert [entry["after"] for entry in channels["attention_heads"]] == [2, 2]
    # Only logits come out, so the residual stream (embeddings, LayerNorms) is narrowed too:
    # measured 0.25x MACs and 0.28x params, read back from the file.
    assert art["macs"] == channels["model_after"]["macs"]
    assert art["macs"] <= 0.3 * channels["model_before"]["macs"], channels
    assert art["params"] <= 0.35 * result.report["baseline"]["params"], art["params"]
    assert result.report["baseline"]["value"] >= 0.97   # measured 1.0
    assert art["drop"] <= 0.015 and result.passed, (art["metric_value"], art["drop"])

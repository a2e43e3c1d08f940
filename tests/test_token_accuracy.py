"""Accuracy on per-position labels (issue 27, item 3a): an LM head's logits (N, T, vocab)
against labels (N, T) score every token; an (N, T, classes) output against one label per
sample is refused in one line instead of taking the argmax over T x classes."""
from __future__ import annotations

import numpy as np
import pytest

import compressor as cz
from compressor.errors import DataError
from compressor.tasks.array.metrics import accuracy, metric_value

VOCAB, LENGTH, WIDTH = 12, 6, 12


def _logits(labels: np.ndarray, vocab: int = VOCAB) -> np.ndarray:
    return np.eye(vocab, dtype=np.float32)[labels]   # one-hot: argmax is the label


def test_per_token_labels_score_every_position():
    labels = np.arange(24).reshape(4, 6) % VOCAB
    outputs = _logits(labels)
    wrong = labels.copy()
    wrong[0, :3] = (wrong[0, :3] + 1) % VOCAB          # 3 of 24 tokens wrong
    assert accuracy(outputs, wrong) == 21 / 24
    ignored = wrong.copy()
    ignored[0, :3] = -100                               # padding: left out
    assert accuracy(outputs, ignored) == 1.0
    assert metric_value("accuracy", outputs, wrong, outputs) == 21 / 24


def test_one_label_per_sample_still_reads_the_class_axis():
    labels = np.array([0, 3, 2, 1])
    assert accuracy(_logits(labels, 4), labels) == 1.0
    assert accuracy(_logits(labels, 4)[:, None, None, :], labels) == 1.0   # (N, 1, 1, classes)


def test_a_sequence_output_with_one_label_per_sample_is_refused():
    with pytest.raises(DataError) as caught:
        accuracy(np.zeros((4, 6, 3), np.float32), np.zeros(4, np.int64))
    assert str(caught.value) == (
        "accuracy: the output has shape (4, 6, 3), 6 positions of 3 classes, but y_val has one "
        "label per sample; give labels of shape (4, 6) to score each position, or pick a pooled "
        "output with validate.output")
    with pytest.raises(DataError, match=r"y_val has shape \(4, 5\), but the output has shape"):
        accuracy(np.zeros((4, 6, 3), np.float32), np.zeros((4, 5), np.int64))


def _lm_head_onnx(path):
    """ids (N, T) int64 -> Gather(embedding) -> MatMul(embedding.T): logits (N, T, vocab)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    table = np.random.default_rng(0).normal(size=(VOCAB, WIDTH)).astype(np.float32)
    table /= np.linalg.norm(table, axis=1, keepdims=True)   # each id's own row scores highest
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["hidden"]),
         helper.make_node("MatMul", ["hidden", "unembed"], ["logits"])], "lm",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n", LENGTH])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", LENGTH, VOCAB])],
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(table.T.copy(), "unembed")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_an_lm_head_with_per_token_labels_runs_through_the_gate(tmp_path):
    pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(1)
    ids = rng.integers(0, VOCAB, (32, LENGTH)).astype(np.int64)
    labels = ids.copy()
    labels[:8, 0] = (labels[:8, 0] + 1) % VOCAB           # 8 of 192 tokens disagree
    result = cz.compress(_lm_head_onnx(tmp_path / "lm.onnx"), "fp16",
                         data=cz.Data(train=(ids, labels), val=(ids, labels)),
                         out_dir=tmp_path / "out", latency=False, quiet=True)
    assert result.report["baseline"]["value"] == 184 / 192
    (row,) = result.report["artifacts"]
    assert row["metric_value"] == 184 / 192 and result.exit_code == 0, result.report["failures"]

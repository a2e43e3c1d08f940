"""One int8 share everywhere and short tensor names in messages (issue 27, item 5): the summary
table, report.md and the gate read the same share, and the gate's "largest float tensors" name
layers, not converter paths or counters. The names below are the converters' own, read from
a litert-torch TFLite, a TensorFlow TFLite and a tf2onnx / torch.onnx ONNX file."""
from __future__ import annotations

import pytest

from compressor.report import render_markdown
from compressor.runtimes.base import WeightTensor
from compressor.report.summary import print_summary
from compressor.core.tensor_names import short_tensor_name
from compressor.render.rows import weight_share_text
from compressor.runtimes.weights import weight_share_at

ROOT = "support.io_models.torch_token_transformer.<locals>.TokenTransformer"
LINEAR2 = (f"{ROOT}/torch.nn.modules.transformer.TransformerEncoder_encoder/torch.nn.modules."
           "transformer.TransformerEncoderLayer_0/torch.nn.modules.linear.Linear_linear2;1")


@pytest.mark.parametrize("name, reader, short", [
    (LINEAR2, "", "encoder.0.linear2"),
    (f"{LINEAR2};;{ROOT}/torch.nn.modules.sparse.Embedding_embedding", "", "encoder.0.linear2"),
    ("arith.constant13", f"ADD {ROOT};1", "add in TokenTransformer"),
    ("token_gru/embedding/embedding_lookup", "", "embedding"),
    ("arith.constant1", "FULLY_CONNECTED token_gru/gru/gru_cell/MatMul_1", "fully_connected in gru/gru_cell"),
    ("const__0", "Gather token_gru/embedding/embedding_lookup", "gather in embedding"),
    ("const__2", "Add node_add_4", "add_4"),
    ("StatefulPartitionedCall/model/dense/BiasAdd/ReadVariableOp", "", "dense"),
    ("dense/kernel:0", "", "dense"),
    ("encoder.layers.0.linear1.weight", "", "encoder.layers.0.linear1.weight"),
    ("W1", "Conv x", "W1"),
    ("const__5", "", "const__5"),
    ("3f", "MatMulInteger node_MatMul_74", "matmulinteger in MatMul_74"),   # ours (onnx_compact)
])
def test_short_tensor_names(name, reader, short):
    assert short_tensor_name(name, reader) == short


def test_long_names_are_cut_to_60_characters():
    name = "model/" + "/".join(f"block_{i}" for i in range(20)) + "/MatMul"
    short = short_tensor_name(name)
    assert len(short) == 60 and short.startswith("...") and short.endswith("block_19")


def test_the_gate_names_the_largest_float_tensors_by_layer():
    weights = [WeightTensor(LINEAR2, "int8", (64, 32), 0, True),
               WeightTensor("arith.constant13", "float32", (32, 32), 0, False, f"ADD {ROOT};1"),
               WeightTensor("token_gru/embedding/embedding_lookup", "float32", (20, 64), 0, False),
               WeightTensor("bias", "float32", (32,), 0, False)]          # small: not counted
    share, largest = weight_share_at(weights, 8)
    assert share == pytest.approx(2048 / (2048 + 4 * 1024 + 4 * 1280))
    assert largest == ["embedding (float32, 5.0 KB)", "add in TokenTransformer (float32, 4.0 KB)"]


ROW = {"path": "model.tflite", "size_bytes": 1000, "gzip_bytes": 900, "metric_value": 0.9,
       "drop": 0.01, "sparsity": 0.0, "params": 10, "macs": 10, "latency_ms_p50": None,
       "est_peak_memory_bytes": 2000, "fits_target": True, "runtime": "ai-edge-litert 2.3.0",
       # elements (biases and scales count): 91.3% int8; matrix bytes (what the gate reads): 83%
       "weight_dtypes": {"int8": 0.913, "float32": 0.087}, "weight_bits": 8,
       "weight_share_at_bits": 0.83}


def test_the_table_report_and_gate_show_one_share(tmp_path, capsys):
    assert weight_share_text(ROW) == "int8 83.0%"
    float_row = {**ROW, "weight_bits": 16, "weight_dtypes": {"float16": 0.97, "float32": 0.03}}
    assert weight_share_text(float_row) == "float16 97.0%, float32 3.0%"
    assert weight_share_text(float_row, top_only=True) == "float16 97.0%"
    report = {"recipe": {"name": "int8", "sha256": "0" * 64}, "framework": "keras",
              "baseline": {"metric": "accuracy", "value": 0.91, "size_bytes": 40, "params": 10},
              "artifacts": [ROW], "passed": False, "seed": 0, "target": None, "gate": {"max_drop": 0.01},
              "failures": ["model.tflite holds only 83% int8 weight bytes"], "timings_s": {}}
    print_summary(report, tmp_path)
    table = capsys.readouterr().out
    assert "int8 83.0%" in table and "91.3" not in table
    markdown = render_markdown(report)
    assert "| int8 83.0% |" in markdown and "91.3" not in markdown

"""Dynamic int8's settings chosen per model (onnx_candidates.py): every candidate scored on
held-out calibration batches against the float graph, the closest kept, onnxruntime's own
quantize_dynamic defaults among them; and the choice in report.json."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from compressor.core.record import RunRecord
from compressor.export.onnx_candidates import PLAIN, mean_cosine, run_outputs
from compressor.export.onnx_quant import quantize_onnx_dynamic

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

VOCAB, TOKENS, WIDTH, HIDDEN = 64, 16, 32, 128
SIZE_BOUND = 0.27


def outlier_block(path: Path) -> Path:
    """ids -> embedding -> LayerNorm (two channels 30x, small weight rows) -> MatMul -> Relu ->
    MatMul: an encoder's feed-forward half with outlier channels."""
    rng = np.random.default_rng(0)
    gamma = np.ones(WIDTH, np.float32)
    gamma[[3, 17]] = 30.0
    up = rng.normal(0, WIDTH ** -0.5, (WIDTH, HIDDEN))
    up[[3, 17]] /= 30.0
    weights = {"table": rng.normal(0, 1, (VOCAB, WIDTH)), "gamma": gamma,
               "beta": rng.normal(0, 0.1, WIDTH), "up": up,
               "down": rng.normal(0, HIDDEN ** -0.5, (HIDDEN, WIDTH))}
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
             helper.make_node("LayerNormalization", ["e", "gamma", "beta"], ["h"], name="norm"),
             helper.make_node("MatMul", ["h", "up"], ["a"], name="up_proj"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "down"], ["y"], name="down_proj")]
    graph = helper.make_graph(
        nodes, "block", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n", TOKENS])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", TOKENS, WIDTH])],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_the_candidate_closest_to_float_on_held_out_batches_is_written(tmp_path):
    source = outlier_block(tmp_path / "block.onnx")
    rng = np.random.default_rng(1)
    batches = [{"ids": rng.integers(0, VOCAB, (32, TOKENS)).astype(np.int64)} for _ in range(4)]
    note = quantize_onnx_dynamic(source, tmp_path / "int8.onnx", calibration=batches)
    tried = {entry["name"]: entry for entry in note["tried"]}
    assert note["artifact"] == "onnx" and note["scored_on"].startswith("1 held-out")
    # outliers present: smoothed and unsmoothed settings both tried; the vendor's defaults too
    assert {e["settings"]["smooth"] for e in tried.values()} == {True, False}
    assert any(e["settings"] == vars(PLAIN) for e in tried.values())
    assert tried[note["winner"]]["score"] == max(e["score"] for e in tried.values())
    # the file written is the winner: its score on the held-out batch (the 4th) is the same
    held_out = batches[3:]
    got = mean_cosine(run_outputs(tmp_path / "int8.onnx", held_out), run_outputs(source, held_out))
    assert got == pytest.approx(tried[note["winner"]]["score"], abs=1e-5)


def test_without_calibration_data_nothing_is_searched(tmp_path):
    note = quantize_onnx_dynamic(outlier_block(tmp_path / "block.onnx"), tmp_path / "int8.onnx")
    assert note["tried"] == [] and note["scored_on"] is None and note["winner"]


def test_note_entries_of_several_artifacts_coexist():
    record = RunRecord()
    record.add_note("plan", {"fits": True})
    record.add_note_entry("candidates", "onnx", {"artifact": "onnx", "winner": "a"})
    record.add_note_entry("candidates", "tflite", {"artifact": "tflite", "winner": "b"})
    record.add_note_entry("candidates", "onnx", {"artifact": "onnx", "winner": "c"})   # re-export
    assert record.notes == {"plan": {"fits": True}, "candidates": [
        {"artifact": "onnx", "winner": "c"}, {"artifact": "tflite", "winner": "b"}]}
    record.add_note("candidates", {"step": "quantize", "winner": "d"})   # a plain note: kept too
    assert record.notes["candidates"][0] == {"step": "quantize", "winner": "d"}
    assert len(record.notes["candidates"]) == 3


@pytest.mark.slow
def test_compress_int8_records_its_candidates_and_beats_quantize_dynamic(cli, tmp_path):
    """A BERT-style sentence encoder with outlier channels through `compress --recipe int8`."""
    from support.encoder_models import token_inputs

    train, val = token_inputs(128, 0), token_inputs(64, 1)
    np.savez(tmp_path / "ids.npz", **{f"x_train.{k}": v for k, v in train.items()},
             **{f"x_val.{k}": v for k, v in val.items()})
    (tmp_path / "int8.yaml").write_text(
        "name: int8_fidelity\nextends: int8\nvalidate: {metric: fidelity, min_fidelity: 0.9}\n")
    done = cli("--recipe", str(tmp_path / "int8.yaml"), "support.encoder_models:sentence_encoder",
               "--data", str(tmp_path / "ids.npz"), "--format", "onnx", "--out",
               str(tmp_path / "out"), cwd=Path(__file__).parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    [note] = report["candidates"]
    scores = {entry["name"]: entry["score"] for entry in note["tried"]}
    plain = next(e["score"] for e in note["tried"] if e["settings"] == vars(PLAIN))
    assert note["artifact"] == "onnx" and "held-out" in note["scored_on"]
    assert scores[note["winner"]] == max(scores.values())
    [row] = report["artifacts"]
    assert row["metric_value"] >= plain - 0.002, (row["metric_value"], note)
    fp32_bytes = report["baseline"]["params"] * 4
    assert (tmp_path / "out" / "model.onnx").stat().st_size <= SIZE_BOUND * fp32_bytes

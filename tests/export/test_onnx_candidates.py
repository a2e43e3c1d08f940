"""Dynamic int8's settings chosen per model (onnx_candidates.py): every candidate scored on
held-out calibration batches against the float graph, sized and timed, the closest kept among
those fast and small enough, onnxruntime's own quantize_dynamic defaults among them; blockwise
int8 (MatMulNBits, onnx_blockwise.py) whole and mixed into dynamic int8; and the choice in
report.json."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from compressor.core.record import RunRecord
from compressor.export import onnx_blockwise
from compressor.export.onnx_blockwise import write_blockwise
from compressor.export.onnx_candidates import (BLOCKWISE, CANDIDATES, PLAIN, PLAIN_NAME, TIE,
                                               eligible, fit, pick, write_dynamic)
from compressor.export.onnx_fidelity import mean_cosine, run_outputs
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
    # every candidate sized and timed; the winner: the best score among the eligible ones
    assert all(e["bytes"] > 0 and e["p50_ms"] > 0 for e in tried.values())
    assert tried[PLAIN_NAME]["eligible"] and tried[PLAIN_NAME]["p50_vs_plain"] == 1.0
    assert BLOCKWISE in tried
    assert tried[note["winner"]]["score"] >= max(e["score"] for e in tried.values()
                                                 if e["eligible"]) - TIE
    # the file written is the winner: its score on the held-out batch (the 4th) is the same
    held_out = batches[3:]
    got = mean_cosine(run_outputs(tmp_path / "int8.onnx", held_out), run_outputs(source, held_out))
    assert got == pytest.approx(tried[note["winner"]]["score"], abs=1e-5)


def test_blockwise_int8_is_matmulnbits_and_closer_to_float_than_dynamic(tmp_path):
    """Every weight MatMul as 8-bit MatMulNBits (blocks along K, accuracy_level 4), the table
    int8: read back from the file; per-block activations beat one scale per tensor."""
    source = outlier_block(tmp_path / "block.onnx")
    rng = np.random.default_rng(1)
    batch = [{"ids": rng.integers(0, VOCAB, (32, TOKENS)).astype(np.int64)}]
    matmuls = onnx_blockwise.constant_matmuls(source)
    assert matmuls == {"up_proj": (WIDTH, HIDDEN), "down_proj": (HIDDEN, WIDTH)}
    block = onnx_blockwise.block_size(matmuls.values())
    assert block == WIDTH   # the shortest K: no zero padding
    write_blockwise(onnx.load(str(source)), tmp_path / "blockwise.onnx", set(matmuls), (), block)
    write_dynamic(source, tmp_path / "plain.onnx", (), PLAIN)
    graph = onnx.load(str(tmp_path / "blockwise.onnx")).graph
    nbits = [n for n in graph.node if n.op_type == "MatMulNBits"]
    assert len(nbits) == 2 and not [n for n in graph.node if n.op_type == "MatMul"]
    attrs = {a.name: a.i for a in nbits[0].attribute}
    assert (attrs["bits"], attrs["block_size"], attrs["accuracy_level"]) == (8, block, 4)
    types = {i.name: i.data_type for i in graph.initializer}
    assert types[nbits[0].input[1]] == TensorProto.UINT8
    assert types["table_int8"] == TensorProto.INT8 and "table" not in types   # rows int8
    fp32 = source.stat().st_size
    assert (tmp_path / "blockwise.onnx").stat().st_size < 0.4 * fp32
    reference = run_outputs(source, batch)
    blockwise = mean_cosine(run_outputs(tmp_path / "blockwise.onnx", batch), reference)
    plain = mean_cosine(run_outputs(tmp_path / "plain.onnx", batch), reference)
    assert blockwise > plain + 0.005, (blockwise, plain)   # 0.9960 vs 0.9863


def test_the_closest_to_float_wins_among_the_fast_and_small_enough():
    tried = [{"name": PLAIN_NAME, "bytes": 100, "score": 0.96, "p50_vs_plain": 1.0},
             {"name": "a", "bytes": 100, "score": 0.99, "p50_vs_plain": 1.1},
             {"name": "slow", "bytes": 100, "score": 0.999, "p50_vs_plain": 2.3},
             {"name": "big", "bytes": 106, "score": 0.998, "p50_vs_plain": 1.0},
             {"name": "b", "bytes": 104, "score": 0.995, "p50_vs_plain": 1.2}]
    for entry in tried:
        entry["eligible"] = eligible(entry, tried)
    assert [e["name"] for e in tried if not e["eligible"]] == ["slow", "big"]
    assert pick(tried) == "b"
    # matmuls by gain per cost (measured alone), while the costs fit: the big one does not
    gains = {"big": 0.004, "small": 0.002, "tiny": 0.0005, "worse": -0.001}
    costs = {"big": 0.4, "small": 0.1, "tiny": 0.1, "worse": 0.1}
    assert fit(gains, costs, budget=0.25) == ["small", "tiny"]
    assert fit(gains, costs, budget=0.6) == ["small", "big", "tiny"]


def test_too_slow_blockwise_gives_a_mixed_candidate(tmp_path, monkeypatch):
    """When every MatMul blockwise is over the latency bound (timings faked: 1.3x), the best
    dynamic setting with blockwise int8 on the matmuls that gain most per multiply competes;
    the written file holds both kinds when it wins."""
    fake = {f"candidate-{BLOCKWISE}.onnx": 1.3}

    def fake_p50(paths, feed, **timing):
        return [fake.get(p.name, 1.0) for p in paths]

    monkeypatch.setattr(onnx_blockwise, "p50_ms", fake_p50)
    source = outlier_block(tmp_path / "block.onnx")
    rng = np.random.default_rng(1)
    batches = [{"ids": rng.integers(0, VOCAB, (32, TOKENS)).astype(np.int64)} for _ in range(4)]
    note = quantize_onnx_dynamic(source, tmp_path / "int8.onnx", calibration=batches)
    tried = {entry["name"]: entry for entry in note["tried"]}
    assert not tried[BLOCKWISE]["eligible"] and tried[BLOCKWISE]["p50_vs_plain"] == 1.3
    ranking = note["mixed_ranking"]
    assert ranking["base"] in CANDIDATES
    assert set(ranking["gain_if_blockwise"]) == {"up_proj", "down_proj"}
    # each matmul is half the multiplies: 0.15 of the plain p50, the budget 0.2: one fits
    assert ranking["cost_vs_plain"] == {"up_proj": 0.15, "down_proj": 0.15}
    gains = ranking["gain_if_blockwise"]
    best = max(gains, key=gains.get)
    [mixed] = [name for name in tried if "+blockwise_" in name]
    assert mixed == f"{ranking['base']}+blockwise_1of2"
    assert tried[mixed]["settings"]["blockwise"] == [best] and gains[best] > 0
    assert tried[mixed]["score"] > tried[ranking["base"]]["score"]
    assert note["winner"] == pick(note["tried"]) == mixed
    ops = [n.op_type for n in onnx.load(str(tmp_path / "int8.onnx")).graph.node]
    assert ops.count("MatMulNBits") == 1 and ops.count("MatMulInteger") == 1


def test_a_mixed_file_under_half_its_budget_is_refit_with_more_matmuls(tmp_path, monkeypatch):
    """The first mixed file (one matmul, estimated 0.15) measures 0.05 over the dynamic file:
    costs are scaled by 1/3 and both matmuls fit the next one."""
    fake = {f"candidate-{BLOCKWISE}.onnx": 1.3, "candidate-mixed0.onnx": 1.05}
    monkeypatch.setattr(onnx_blockwise, "p50_ms",
                        lambda paths, feed, **timing: [fake.get(p.name, 1.0) for p in paths])
    rng = np.random.default_rng(1)
    batches = [{"ids": rng.integers(0, VOCAB, (32, TOKENS)).astype(np.int64)} for _ in range(4)]
    note = quantize_onnx_dynamic(outlier_block(tmp_path / "block.onnx"), tmp_path / "int8.onnx",
                                 calibration=batches)
    base = note["mixed_ranking"]["base"]
    mixed = {e["name"]: e for e in note["tried"] if "+blockwise_" in e["name"]}
    assert list(mixed) == [f"{base}+blockwise_1of2", f"{base}+blockwise_2of2"]
    assert [e["p50_vs_plain"] for e in mixed.values()] == [1.05, 1.0]
    assert note["winner"] == pick(note["tried"])


def test_a_failing_blockwise_quantizer_leaves_the_dynamic_candidates(tmp_path, monkeypatch):
    def fails(*args, **kwargs):
        raise ValueError("unsupported shape")

    monkeypatch.setattr(onnx_blockwise, "blockwise", fails)
    rng = np.random.default_rng(1)
    batches = [{"ids": rng.integers(0, VOCAB, (32, TOKENS)).astype(np.int64)} for _ in range(4)]
    note = quantize_onnx_dynamic(outlier_block(tmp_path / "block.onnx"), tmp_path / "int8.onnx",
                                 calibration=batches)
    assert note["blockwise"].startswith("not tried: onnxruntime's MatMulNBits")
    assert note["winner"] in CANDIDATES and {e["name"] for e in note["tried"]} <= set(CANDIDATES)
    assert all(e["p50_ms"] > 0 for e in note["tried"])


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
    best = max(e["score"] for e in note["tried"] if e["eligible"])
    assert scores[note["winner"]] >= best - TIE   # within TIE the earlier listed wins
    [row] = report["artifacts"]
    assert row["metric_value"] >= plain - 0.002, (row["metric_value"], note)
    fp32_bytes = report["baseline"]["params"] * 4
    assert (tmp_path / "out" / "model.onnx").stat().st_size <= SIZE_BOUND * fp32_bytes

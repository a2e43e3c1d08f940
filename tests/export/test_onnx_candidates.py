"""Dynamic int8's settings chosen per model (onnx_candidates.py): every candidate scored on
held-out calibration batches against the float graph, sized and costed from its graph
(onnx_cost.py), the closest kept among those cheap and small enough, onnxruntime's own
quantize_dynamic defaults among them; blockwise int8 (MatMulNBits, onnx_blockwise.py) whole
and mixed into dynamic int8; the choice in report.json; and the same file on every run
whatever the timings."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from compressor.core.record import RunRecord
from compressor.export import onnx_blockwise, onnx_cost
from compressor.export.onnx_blockwise import write_blockwise
from compressor.export.onnx_candidates import (BLOCKWISE, CANDIDATES, PLAIN, PLAIN_NAME, TIE,
                                               eligible, pick)
from compressor.export.onnx_dynamic import write_dynamic
from compressor.export.onnx_mix import fit
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
    # every candidate sized, costed and timed; the winner: the best score among the eligible
    assert all(e["bytes"] > 0 and e["p50_ms"] > 0 for e in tried.values())
    assert tried[PLAIN_NAME]["eligible"] and tried[PLAIN_NAME]["p50_vs_plain"] == 1.0
    assert tried[PLAIN_NAME]["cost_vs_plain"] == 1.0
    # every dynamic setting is MatMulInteger on the same matmuls: the plain file's cost
    assert {e["cost_vs_plain"] for n, e in tried.items() if n in CANDIDATES} == {1.0}
    # blockwise whole: 0.5 + 0.5 x 6.0 = 3.5x, over the bound whatever it timed
    assert tried[BLOCKWISE]["cost_vs_plain"] == pytest.approx(
        onnx_cost.REST_SHARE + (1 - onnx_cost.REST_SHARE) * onnx_cost.NBITS_COST)
    assert not tried[BLOCKWISE]["eligible"]
    assert note["cost_model"]["kernel_cost"] == {"MatMulInteger": 1.0, "MatMulNBits": 6.0}
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


def test_the_closest_to_float_wins_among_the_cheap_and_small_enough():
    """The modelled cost decides, never the timing: "b" timed 3.0x but models 1.2x."""
    tried = [{"name": PLAIN_NAME, "bytes": 100_000, "score": 0.96, "cost_vs_plain": 1.0},
             {"name": "a", "bytes": 100_000, "score": 0.99, "cost_vs_plain": 1.1},
             {"name": "slow", "bytes": 100_000, "score": 0.999, "cost_vs_plain": 2.3,
              "p50_vs_plain": 1.0},
             {"name": "big", "bytes": 107_000, "score": 0.998, "cost_vs_plain": 1.0},
             {"name": "b", "bytes": 104_000, "score": 0.995, "cost_vs_plain": 1.2,
              "p50_vs_plain": 3.0}]
    for entry in tried:
        entry["eligible"] = eligible(entry, tried)
    assert [e["name"] for e in tried if not e["eligible"]] == ["slow", "big"]
    assert pick(tried) == "b"
    # scores within TIE (their resolution) are equal: the smaller file wins (bench bert2x64:
    # per-channel 0.999988 at 171 kB vs per-tensor 0.999987 at 168 kB)
    tied = [{"name": "per_channel", "bytes": 171_057, "score": 0.999988},
            {"name": PLAIN_NAME, "bytes": 168_342, "score": 0.999987}]
    assert pick(tied) == PLAIN_NAME
    tied[0]["score"] = 0.999989
    assert pick(tied) == "per_channel"
    # matmuls by gain per cost (measured alone), while the costs fit: the big one does not
    gains = {"big": 0.004, "small": 0.002, "tiny": 0.0005, "worse": -0.001}
    costs = {"big": 0.4, "small": 0.1, "tiny": 0.1, "worse": 0.1}
    assert fit(gains, costs, budget=0.25) == ["small", "tiny"]
    assert fit(gains, costs, budget=0.6) == ["small", "big", "tiny"]
    # a gain under MIN_GAIN (1e-5 of cosine) buys nothing a user sees, however cheap
    assert fit({"noise": 4e-6, "real": 2e-5}, {"noise": 1e-4, "real": 0.1}, budget=1) == ["real"]


def test_too_costly_blockwise_gives_a_mixed_candidate(tmp_path, monkeypatch):
    """When every MatMul blockwise is over the latency bound (a kernel cost of 1.6: 0.5 + 0.5
    x 1.6 = 1.3x the plain file), the best dynamic setting with blockwise int8 on the matmuls
    that gain most per multiply competes; the written file holds both kinds when it wins."""
    monkeypatch.setattr(onnx_cost, "NBITS_COST", 1.6)
    source = outlier_block(tmp_path / "block.onnx")
    rng = np.random.default_rng(1)
    batches = [{"ids": rng.integers(0, VOCAB, (32, TOKENS)).astype(np.int64)} for _ in range(4)]
    note = quantize_onnx_dynamic(source, tmp_path / "int8.onnx", calibration=batches)
    tried = {entry["name"]: entry for entry in note["tried"]}
    assert not tried[BLOCKWISE]["eligible"] and tried[BLOCKWISE]["cost_vs_plain"] == 1.3
    ranking = note["mixed_ranking"]
    assert ranking["base"] in CANDIDATES
    assert set(ranking["gain_if_blockwise"]) == {"up_proj", "down_proj"}
    # each matmul is half the multiplies: 0.5 x 0.6 / 2 = 0.15 of the plain file's modelled
    # cost, the budget 0.2: one fits
    assert ranking["cost_vs_plain"] == {"up_proj": 0.15, "down_proj": 0.15}
    gains = ranking["gain_if_blockwise"]
    best = max(gains, key=gains.get)
    [mixed] = [name for name in tried if "+blockwise_" in name]
    assert mixed == f"{ranking['base']}+blockwise_1of2"
    assert tried[mixed]["settings"]["blockwise"] == [best] and gains[best] > 0
    assert tried[mixed]["score"] > tried[ranking["base"]]["score"]
    assert tried[mixed]["cost_vs_plain"] == pytest.approx(1.15) and tried[mixed]["eligible"]
    assert note["winner"] == pick(note["tried"]) == mixed
    ops = [n.op_type for n in onnx.load(str(tmp_path / "int8.onnx")).graph.node]
    assert ops.count("MatMulNBits") == 1 and ops.count("MatMulInteger") == 1


def test_the_cost_ratio_is_read_from_the_graph(tmp_path):
    """Plain dynamic vs blockwise int8 of the same two matmuls (32x128 and 128x32): every
    multiply costs NBITS_COST (6.0) times as much, the rest of the graph REST_SHARE (0.5)."""
    source = outlier_block(tmp_path / "block.onnx")
    write_dynamic(source, tmp_path / "plain.onnx", (), PLAIN)
    write_dynamic(source, tmp_path / "per_channel.onnx", (), CANDIDATES["7bit_per_channel"])
    write_blockwise(onnx.load(str(source)), tmp_path / "blockwise.onnx",
                    {"up_proj", "down_proj"}, (), WIDTH)
    write_dynamic(source, tmp_path / "mixed.onnx", {"down_proj"}, PLAIN)
    write_blockwise(onnx.load(str(tmp_path / "mixed.onnx")), tmp_path / "mixed.onnx",
                    {"down_proj"}, (), WIDTH)
    plain = onnx_cost.matmul_cost(tmp_path / "plain.onnx")
    assert plain == 2 * WIDTH * HIDDEN == 8192.0   # two MatMulInteger, 4096 multiplies each
    assert onnx_cost.matmul_cost(tmp_path / "per_channel.onnx") == plain
    blockwise = onnx_cost.matmul_costs(tmp_path / "blockwise.onnx")
    assert sorted(blockwise.values()) == [4096 * 6.0, 4096 * 6.0]
    assert sum(blockwise.values()) / plain == onnx_cost.NBITS_COST == 6.0   # the kernel factor
    assert onnx_cost.vs_plain(sum(blockwise.values()), plain) == 3.5        # 0.5 + 0.5 x 6
    assert onnx_cost.vs_plain(onnx_cost.matmul_cost(tmp_path / "mixed.onnx"), plain) == 2.25
    assert onnx_cost.vs_plain(plain, plain) == 1.0
    # one matmul blockwise adds what the mixed ranking says it does: 0.5 x 5 x 4096 / 8192
    assert onnx_cost.blockwise_costs({"down_proj": (HIDDEN, WIDTH)}, plain) == {"down_proj": 1.25}
    # a pure function of the file: read again, the same numbers
    assert onnx_cost.matmul_costs(tmp_path / "blockwise.onnx") == blockwise


def test_the_same_model_and_seed_give_the_same_bytes_whatever_the_timings(tmp_path, monkeypatch):
    """Two searches of one model, every candidate but the plain file timed at random (0.5-3x
    its p50): the same eligibility, winner, costs and file, byte for byte. The kernel cost is
    set so blockwise whole is over the bound and a mixed candidate is built too."""
    monkeypatch.setattr(onnx_cost, "NBITS_COST", 1.6)
    clock = np.random.default_rng()
    monkeypatch.setattr(onnx_blockwise, "p50_ms", lambda paths, feed, **timing: [
        1.0 if p.name == f"candidate-{PLAIN_NAME}.onnx" else float(clock.uniform(0.5, 3.0))
        for p in paths])
    source = outlier_block(tmp_path / "block.onnx")
    rng = np.random.default_rng(1)
    batches = [{"ids": rng.integers(0, VOCAB, (32, TOKENS)).astype(np.int64)} for _ in range(4)]
    notes, files = [], []
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        notes.append(quantize_onnx_dynamic(source, tmp_path / run / "int8.onnx",
                                           calibration=batches))
        files.append((tmp_path / run / "int8.onnx").read_bytes())
    decided = [[(e["name"], e["cost_vs_plain"], e["eligible"], e["score"], e["bytes"])
                for e in note["tried"]] for note in notes]
    assert decided[0] == decided[1]
    assert notes[0]["winner"] == notes[1]["winner"] and files[0] == files[1]
    assert notes[0]["mixed_ranking"] == notes[1]["mixed_ranking"]
    assert any("+blockwise_" in name for name, *_ in decided[0])
    timed = [[e["p50_vs_plain"] for e in note["tried"]] for note in notes]
    assert timed[0] != timed[1]   # the timings did differ, and decided nothing


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
    assert all(e["p50_ms"] > 0 and e["cost_vs_plain"] == 1.0 for e in note["tried"])


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

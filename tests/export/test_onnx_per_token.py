"""Inputs rounded per token in dynamic int8 ONNX (onnx_per_token.py): the rewritten file
computes exactly the per-row symmetric rounding in onnxruntime's optimized session (where its
MatMulIntegerToFloat fusion reads one A scale), and the mixed candidate (onnx_mix.py) takes
the inputs where it gains within the cost model's budget."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from compressor.export import onnx_cost
from compressor.export.onnx_candidates import CANDIDATES, PLAIN
from compressor.export.onnx_dynamic import write_dynamic
from compressor.export.onnx_fidelity import mean_cosine, run_outputs
from compressor.export.onnx_per_token import ZERO_POINT_NAME, round_per_token, sites
from compressor.export.onnx_quant import quantize_onnx_dynamic

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

K, N, TOKENS, VOCAB, LOUD = 32, 16, 8, 2048, 7   # token id LOUD has a 40x embedding


def one_matmul(path: Path, opset: int) -> Path:
    weight = np.random.default_rng(0).normal(0, K ** -0.5, (K, N)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")], "one",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", TOKENS, K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", TOKENS, N])],
        [numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("opset", [17, 18])   # ReduceMax's axes: attribute, then input
def test_a_rewritten_input_is_rounded_per_row_exactly(tmp_path, opset):
    source = one_matmul(tmp_path / "fp32.onnx", opset)
    write_dynamic(source, tmp_path / "tensor.onnx", (), PLAIN)
    proto = onnx.load(str(tmp_path / "tensor.onnx"))
    assert sites(proto) == {"x": K}
    assert round_per_token(proto, {"x"}) == 1
    onnx.checker.check_model(proto)
    onnx.save(proto, str(tmp_path / "token.onnx"))
    ops = [node.op_type for node in proto.graph.node]
    assert "DynamicQuantizeLinear" not in ops and ops.count("MatMulInteger") == 1
    x = np.random.default_rng(1).normal(0, 1, (2, TOKENS, K)).astype(np.float32)
    x[0, 3] *= 50.0   # one loud token: per tensor, it sets every row's step
    x[1, 5] = 0.0     # an all-zero row stays zero (no division by a zero scale)
    [[got]] = run_outputs(tmp_path / "token.onnx", [{"x": x}])   # optimized session
    weights = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    [matmul] = [node for node in proto.graph.node if node.op_type == "MatMulInteger"]
    assert matmul.input[2] == ZERO_POINT_NAME
    w_int8 = weights[matmul.input[1]].astype(np.float64)
    w_scale = next(v for name, v in weights.items() if name.startswith("w") and "scale" in name)
    scale = np.maximum(np.abs(x).max(-1, keepdims=True), 1e-30).astype(np.float32) / np.float32(127)
    rows = np.round(x / scale)   # numpy and ONNX Round: half to even
    assert np.abs(rows).max() <= 127
    want = (rows @ w_int8) * scale * w_scale
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert np.all(got[1, 5] == 0)
    # per token, the quiet rows keep their precision; per tensor they lose it to the loud one
    exact = x.astype(np.float64) @ numpy_helper.to_array(onnx.load(str(source)).graph.initializer[0])
    [[per_tensor]] = run_outputs(tmp_path / "tensor.onnx", [{"x": x}])
    quiet = np.ones(TOKENS, bool)
    quiet[3] = False
    error = {name: np.abs(out[0][quiet] - exact[0][quiet]).mean()
             for name, out in (("token", got), ("tensor", per_tensor))}
    assert error["token"] < error["tensor"] / 10, error


def loud_token_block(path: Path) -> Path:
    """ids -> embedding (one token 40x) -> MatMul -> Relu -> MatMul -> LayerNorm: the loud
    token's rows set a per-tensor scale for every other token; the closing LayerNorm makes
    every token count alike in the output's cosine."""
    rng = np.random.default_rng(0)
    table = rng.normal(0, 1, (VOCAB, K))
    table[LOUD] *= 40.0
    weights = {"table": table, "up": rng.normal(0, K ** -0.5, (K, 4 * K)),
               "down": rng.normal(0, (4 * K) ** -0.5, (4 * K, K))}
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
             helper.make_node("MatMul", ["e", "up"], ["a"], name="up_proj"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "down"], ["d"], name="down_proj"),
             helper.make_node("LayerNormalization", ["d", "gamma"], ["y"], name="norm")]
    weights["gamma"] = np.ones(K)
    graph = helper.make_graph(
        nodes, "block", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n", TOKENS])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", TOKENS, K])],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_the_mixed_candidate_rounds_inputs_per_token_where_they_gain(tmp_path, monkeypatch):
    """A tiny graph's per-token ops cost more than its matmuls (the model: 25,000 + 120 x K
    multiplies per input, against 2 x 4,096 for the plain file): never taken as it is; with
    the ops modelled nearly free, both inputs are, the file scores closer to float, and the
    cost model reads them back from it."""
    source = loud_token_block(tmp_path / "block.onnx")
    rng = np.random.default_rng(1)
    ids = [rng.integers(0, VOCAB, (32, TOKENS)) for _ in range(4)]
    for batch in ids:
        batch[:, 0] = LOUD   # every row starts with the loud token (a [CLS])
    batches = [{"ids": batch.astype(np.int64)} for batch in ids]
    note = quantize_onnx_dynamic(source, tmp_path / "costly.onnx", calibration=batches)
    ranking = note["mixed_ranking"]
    # the table's rows and the Relu's output, each costing over the 0.2 budget: not measured
    assert len(ranking["per_token_cost_vs_plain"]) == 2
    assert min(ranking["per_token_cost_vs_plain"].values()) > 1.0
    assert ranking["gain_if_per_token"] == {} and ranking["gain_if_blockwise"] == {}
    assert note["mixed"] == "not tried: no place fits the budget alone (none measured)"
    assert not any("+per_token_" in entry["name"] for entry in note["tried"])

    monkeypatch.setattr(onnx_cost, "PER_TOKEN_FIXED", 0)
    monkeypatch.setattr(onnx_cost, "PER_TOKEN_PER_CHANNEL", 1)
    note = quantize_onnx_dynamic(source, tmp_path / "int8.onnx", calibration=batches)
    tried = {entry["name"]: entry for entry in note["tried"]}
    ranking = note["mixed_ranking"]
    assert ranking["base"] in CANDIDATES and all(g > 0 for g in ranking["gain_if_per_token"].values())
    [mixed] = [name for name in tried if "+per_token_" in name]
    assert mixed.startswith(f"{ranking['base']}+per_token_2of2")
    assert tried[mixed]["settings"]["per_token"] == sorted(ranking["gain_if_per_token"])
    assert tried[mixed]["score"] > tried[ranking["base"]]["score"] + 0.001
    # K = 32 and 128 at one multiply per channel: 0.5 x 160 / 8192 over the plain file
    assert tried[mixed]["cost_vs_plain"] == pytest.approx(1.0 + 0.5 * (32 + 128) / 8192, abs=1e-4)
    assert note["winner"] == mixed
    graph = onnx.load(str(tmp_path / "int8.onnx")).graph
    assert not [node for node in graph.node if node.op_type == "DynamicQuantizeLinear"]
    costs = onnx_cost.matmul_costs(tmp_path / "int8.onnx")
    assert sorted(v for k, v in costs.items() if k.endswith(" per token")) == [32.0, 128.0]
    held_out = batches[3:]
    got = mean_cosine(run_outputs(tmp_path / "int8.onnx", held_out), run_outputs(source, held_out))
    assert got == pytest.approx(tried[mixed]["score"], abs=1e-5)

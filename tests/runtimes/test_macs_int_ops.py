"""MACs count every op that multiplies by a weight, whatever its number format, by one rule
table for both formats (compressor/runtimes/macs.py; issue 38: a sentence encoder's dynamic
int8 ONNX and its TFLite disagreed). Products of two activations (attention scores and the
attention-weighted sum) count in neither format."""
from __future__ import annotations

import numpy as np
import pytest
from support.io_models import bert_inputs, tiny_bert

from compressor.core.kernel_ops import TFLITE_PASSTHROUGH
from compressor.runtimes import inspect_artifact
from compressor.runtimes.macs import kernel_macs
from compressor.runtimes.onnx import inspect_onnx

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

M, K, N = 8, 64, 48


def _int8(*shape):
    return np.random.default_rng(0).integers(-8, 8, shape).astype(np.int8)


def _scalar(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def _macs_of(tmp_path, nodes, inputs, initializers, outputs, opset=21):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                    helper.make_opsetid("com.microsoft", 1)])
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    return inspect_onnx(path).macs


def _matmul_integer(tmp_path):
    return _macs_of(tmp_path, [helper.make_node("MatMulInteger", ["a", "b"], ["y"])],
                    [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, M, K])],
                    [numpy_helper.from_array(_int8(K, N), "b")],
                    [helper.make_tensor_value_info("y", TensorProto.INT32, None)])


def _qlinear_matmul(tmp_path):
    inits = [_scalar("sa", 0.1), _scalar("za", 128, np.uint8), numpy_helper.from_array(_int8(K, N), "b"),
             _scalar("sb", 0.1), _scalar("zb", 0, np.int8), _scalar("sy", 0.1), _scalar("zy", 128, np.uint8)]
    return _macs_of(tmp_path, [helper.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb",
                                                                  "sy", "zy"], ["y"])],
                    [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, M, K])], inits,
                    [helper.make_tensor_value_info("y", TensorProto.UINT8, None)])


def _matmul_nbits(tmp_path):
    block = 32
    packed = np.zeros((N, K // block, block // 2), np.uint8)   # 4 bits: two values a byte
    node = helper.make_node("MatMulNBits", ["a", "b", "s"], ["y"], domain="com.microsoft",
                            K=K, N=N, bits=4, block_size=block)
    return _macs_of(tmp_path, [node], [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, M, K])],
                    [numpy_helper.from_array(packed, "b"),
                     numpy_helper.from_array(np.ones(N * K // block, np.float32), "s")],
                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])


def _conv_integer(tmp_path):   # 16x16 image, 3 -> 8 channels, 3x3 kernel, stride 2, pad 1: 8x8 out
    node = helper.make_node("ConvInteger", ["x", "w"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                            pads=[1, 1, 1, 1])
    return _macs_of(tmp_path, [node], [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 3, 16, 16])],
                    [numpy_helper.from_array(_int8(8, 3, 3, 3), "w")],
                    [helper.make_tensor_value_info("y", TensorProto.INT32, None)])


def _conv_transpose(tmp_path):   # 4 -> 2 channels, 3x3, stride 2: each of 5x5 input pixels once
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], kernel_shape=[3, 3], strides=[2, 2])
    return _macs_of(tmp_path, [node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 5, 5])],
                    [numpy_helper.from_array(np.ones((4, 2, 3, 3), np.float32), "w")],
                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])


def _qattention(tmp_path):   # the fused int8 Q, K, V projection of onnxruntime's quantized BERT
    inputs = ["a", "w", "bias", "sa", "sw", "", "za", "zw"]
    node = helper.make_node("QAttention", inputs, ["y"], domain="com.microsoft", num_heads=4)
    return _macs_of(tmp_path, [node], [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, M, K])],
                    [numpy_helper.from_array(_int8(K, 3 * K), "w"),
                     numpy_helper.from_array(np.zeros(3 * K, np.float32), "bias"), _scalar("sa", 0.1),
                     _scalar("sw", 0.1), _scalar("za", 128, np.uint8), _scalar("zw", 0, np.int8)],
                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])


@pytest.mark.parametrize(("build", "expected"), [
    (_matmul_integer, M * K * N), (_qlinear_matmul, M * K * N), (_matmul_nbits, M * K * N),
    (_conv_integer, 8 * 8 * 8 * 3 * 3 * 3), (_conv_transpose, 5 * 5 * 4 * 2 * 3 * 3),
    (_qattention, M * K * 3 * K)],
    ids=lambda v: getattr(v, "__name__", ""))
def test_one_node_graph_counts_m_k_n(tmp_path, build, expected):
    assert build(tmp_path) == expected


def test_fused_ops_keep_the_shapes_after_them(tmp_path):
    """onnxruntime's saved optimized graph: DynamicQuantizeMatMul then FusedMatMul (transB)
    then Attention's fused QKV weight; symbolic shape inference had no rule for the first two
    and stopped there, counting 0 for everything after."""
    t, h = 6, 16
    nodes = [helper.make_node("DynamicQuantizeMatMul", ["x", "w1", "s1", "z1"], ["a"], domain="com.microsoft"),
             helper.make_node("FusedMatMul", ["a", "w2"], ["b"], domain="com.microsoft", transB=1),
             helper.make_node("Attention", ["b", "wqkv", "bqkv"], ["y"], domain="com.microsoft",
                              num_heads=2),
             helper.make_node("Einsum", ["y", "we"], ["z"], equation="btd,de->bte")]
    inits = [numpy_helper.from_array(_int8(K, N), "w1"), _scalar("s1", [0.1]), _scalar("z1", [0], np.int8),
             numpy_helper.from_array(np.ones((h, N), np.float32), "w2"),
             numpy_helper.from_array(np.ones((h, 3 * h), np.float32), "wqkv"),
             numpy_helper.from_array(np.ones(3 * h, np.float32), "bqkv"),
             numpy_helper.from_array(np.ones((h, 5), np.float32), "we")]
    macs = _macs_of(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", t, K])],
                    inits, [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    assert macs == t * K * N + t * N * h + t * h * 3 * h + t * h * 5


def test_tflite_rules_from_one_table():
    """TFLite's ops by the same rule: positions x weight elements, a weight reached through
    DEQUANTIZE (fp16 / int8), a transposed conv per input pixel, a batched constant per slice."""
    weights = {"fc_w": [10, 20], "conv_w": [8, 3, 3, 4], "dw_w": [1, 3, 3, 8], "tc_w": [4, 3, 3, 8],
               "bm_w": [2, 20, 6], "q_w": [10, 20]}
    shapes = {"fc": [5, 10], "conv": [1, 6, 6, 8], "dw": [1, 6, 6, 8], "tc_in": [1, 3, 3, 8],
              "tc": [1, 6, 6, 4], "bm": [2, 5, 6], "fq": [5, 10]}
    ops = [("FULLY_CONNECTED", ["x", "fc_w"], ["fc"]), ("CONV_2D", ["img", "conv_w"], ["conv"]),
           ("DEPTHWISE_CONV_2D", ["conv", "dw_w"], ["dw"]),
           ("TRANSPOSE_CONV", ["shape", "tc_w", "tc_in"], ["tc"]),
           ("BATCH_MATMUL", ["x2", "bm_w"], ["bm"]), ("BATCH_MATMUL", ["bm", "fc"], ["att"]),
           ("DEQUANTIZE", ["q_w"], ["deq"]), ("FULLY_CONNECTED", ["x", "deq"], ["fq"])]
    assert kernel_macs(ops, weights, shapes, TFLITE_PASSTHROUGH) == (
        5 * 200 + 36 * 8 * 36 + 36 * 72 + 9 * 4 * 9 * 8 + 2 * 5 * 120 + 0 + 5 * 200)


# ---- a BERT-style encoder through compressor's own int8 pipeline ---------------------------

def _analytic_macs(layers: int, width: int, ffn: int, positions: int) -> int:
    """Per layer and position: q, k, v, out projections 4 H^2 and the FFN 2 H I; the pooler's
    H^2 on the first position. Attention scores and the weighted sum (2 T^2 H per layer) are
    products of two activations: not counted (runtimes/macs.py)."""
    return layers * positions * (4 * width * width + 2 * width * ffn) + width * width


@pytest.fixture(scope="module")
def int8_encoder(tmp_path_factory):
    import compressor as cz
    from compressor.config.recipe import load_recipe

    recipe = load_recipe("int8")
    recipe = recipe.model_copy(update={"validation": recipe.validation.model_copy(
        update={"metric": "fidelity", "min_fidelity": 0.5})})
    out = tmp_path_factory.mktemp("int8_encoder")
    result = cz.compress(tiny_bert(), recipe, data={"x_train": bert_inputs(16), "x_val": bert_inputs(8, 1)},
                         out_dir=out, latency=False, quiet=True)
    assert result.exit_code == 0, result.report["failures"]
    return result


@pytest.mark.slow
def test_dynamic_int8_encoder_counts_the_same_in_both_formats(int8_encoder, tmp_path):
    import onnxruntime as ort

    config = tiny_bert().config
    expected = _analytic_macs(config.num_hidden_layers, config.hidden_size,
                              config.intermediate_size, positions=16)
    report = int8_encoder.report
    assert report["quantize"]["mode"] == "dynamic"
    rows = {row["format"]: row for row in report["artifacts"]}
    assert set(rows) == {"onnx", "tflite"}
    onnx_path = int8_encoder.artifacts["onnx"]
    ops = inspect_artifact(onnx_path).ops
    # dynamic int8 (MatMulInteger) or blockwise int8 (MatMulNBits), whichever the candidate
    # search measured closer to float (export/onnx_candidates.py): both counted by the table
    kernels = {op for op in ("MatMulInteger", "MatMulNBits") if ops.get(op)}
    assert kernels and ops.get("DynamicQuantizeLinear", 0) >= ("MatMulInteger" in kernels), ops
    for row in rows.values():
        assert abs(row["macs"] - expected) <= 0.01 * expected, (row["format"], row["macs"], expected)
    # the same file as onnxruntime saves it optimized: MatMulIntegerToFloat,
    # DynamicQuantizeMatMul, FusedMatMul (it counted 0)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    optimized = inspect_onnx(tmp_path / "optimized.onnx", {"input_ids": (16,), "attention_mask": (16,)})
    if "MatMulInteger" in kernels:
        assert "MatMulInteger" not in optimized.ops and optimized.ops.get("MatMulIntegerToFloat"), \
            optimized.ops
    assert abs(optimized.macs - expected) <= 0.01 * expected, (optimized.macs, expected)

"""Layers kept float by the int8 fallback are found by name in the TFLite file and the ONNX
graph. Layer names may hold '/' (keras.applications' MobileNetV3: a stem "Conv" and nine
"expanded_conv_N/squeeze_excite/Conv"): matching path parts one by one made "Conv" claim
every squeeze-excite conv, so `mixed_int8_fp16` kept 10 conv ops float for one layer and was
refused ("kept 10 conv/dense op(s) in float") although plain int8 is 99% int8. In ONNX the
same slip also left "expanded_conv/depthwise" int8: a name holding '/' matched no node."""
from __future__ import annotations

import pytest
from support import keras_applications_like as kal
from support.artifact_checks import kernel_dtypes

from compressor.backends.keras.mixed import layer_of

KERNELS = ["Conv", "expanded_conv/depthwise", "expanded_conv/squeeze_excite/Conv",
           "expanded_conv/squeeze_excite/Conv_1", "expanded_conv/project", "block_se_reduce",
           "block_se_expand", "Conv_1", "Logits"]


@pytest.mark.parametrize("tensor, layer", [
    ("applications_like/Conv/Conv2D", "Conv"),
    ("applications_like/expanded_conv/squeeze_excite/Conv/Conv2D", "expanded_conv/squeeze_excite/Conv"),
    ("applications_like/expanded_conv/squeeze_excite/Conv_1/BiasAdd;applications_like/"
     "expanded_conv/squeeze_excite/Conv_1/Conv2D", "expanded_conv/squeeze_excite/Conv_1"),
    ("applications_like/expanded_conv/project/BatchNorm/FusedBatchNormV3;applications_like/"
     "expanded_conv/project/Conv2D", "expanded_conv/project"),
    ("applications_like/Conv_1/Conv2D", "Conv_1"),
    ("applications_like/Logits/MatMul", "Logits"),
    ("applications_like/expanded_conv/depthwise/BatchNorm/FusedBatchNormV3", "expanded_conv/depthwise"),
    ("applications_like/transition/BatchNorm/FusedBatchNormV3", None),
])
def test_a_tensor_belongs_to_the_longest_layer_path_it_holds(tensor, layer):
    assert layer_of(tensor, KERNELS) == layer


@pytest.mark.parametrize("node, pattern, belongs", [
    ("MobilenetV3small/Conv/Conv2D", "Conv", True),
    ("MobilenetV3small/expanded_conv/squeeze_excite/Conv/BiasAdd", "Conv", False),
    ("MobilenetV3small/expanded_conv/squeeze_excite/Conv/BiasAdd",
     "expanded_conv/squeeze_excite/Conv", True),
    ("MobilenetV3small/expanded_conv/depthwise/depthwise", "expanded_conv/depthwise", True),
    ("MobilenetV3small/expanded_conv_1/depthwise/depthwise", "expanded_conv/depthwise", False),
    ("MobilenetV3small/expanded_conv_1/project/Conv2D", "expanded_conv*", True),
    ("model/dense_1/MatMul;model/dense_1/BiasAdd", "dense*", True),
    ("/head/head.3/Gemm", "head.3", True),       # torch.onnx: each part a whole module path
    ("/head/head.3/Gemm", "head", True),
])
def test_an_onnx_node_belongs_to_the_layer_its_path_names(node, pattern, belongs):
    from onnx import helper

    from compressor.export.onnx import names_layer

    assert names_layer(helper.make_node("Conv", ["x", "w"], ["y"], name=node), pattern) is belongs


@pytest.mark.slow
def test_one_float_layer_named_conv_keeps_one_op_float(tmp_path):
    from compressor.backends.keras import KerasBackend
    from compressor.core.context import ModelState
    from compressor.schemes import Int8Static, apply_scheme
    from compressor.config.steps import QuantizeConfig
    from support import helpers

    data = kal.quadrant_data(train=64, val=16)
    model = kal.applications_like()
    backend = KerasBackend()
    ctx = helpers.context(data, tmp_path / "work")
    config = QuantizeConfig(mode="ptq", fallback="auto", fallback_dtype="float16",
                            calibration_samples=16)
    state = apply_scheme(backend, ModelState(model=model, float_layers=("Conv",)),
                         Int8Static.from_step(config), ctx).after(config)
    from compressor.export.int8 import export_checked

    path = export_checked(backend, state, "tflite", tmp_path / "m.tflite", ctx)
    assert sorted(kernel_dtypes(path)) == ["float16"] + ["int8"] * (len(KERNELS) - 1)

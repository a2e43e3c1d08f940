"""A keras.applications-style net (Rescaling(1/255) + Normalization before the stem conv) fed
images in [0, 1]: its int8 ONNX quantizes the raw image, the preprocessing folded into the stem
conv (export/onnx_input_fold.py), through tf2onnx's graph and the int8 read-back check; fed
the [0, 255] it expects, the file keeps its preprocessing ops."""
from __future__ import annotations

import pytest
from support import helpers
from support import keras_applications_like as kal

from compressor.core.context import Data


def _int8_onnx_ops(data: Data, folder) -> list[str]:
    import onnx

    from compressor.backends.keras import KerasBackend
    from compressor.core.context import ModelState
    from compressor.export.int8 import export_checked
    from compressor.schemes import Int8Static, apply_scheme
    from compressor.config.steps import QuantizeConfig

    backend = KerasBackend()
    ctx = helpers.context(data, folder / "work")
    config = QuantizeConfig(mode="ptq", calibration_samples=32)
    state = apply_scheme(backend, ModelState(model=kal.applications_like()),
                         Int8Static.from_step(config), ctx).after(config)
    path = export_checked(backend, state, "onnx", folder / "model.onnx", ctx)
    return [node.op_type for node in onnx.load(str(path)).graph.node]


@pytest.mark.slow
def test_unit_images_reach_the_stem_conv_raw(tmp_path):
    raw = kal.quadrant_data(train=64, val=16)
    unit = kal.unit_images(raw)
    ops = _int8_onnx_ops(unit, tmp_path / "unit")
    assert set(ops[:ops.index("Conv")]) == {"QuantizeLinear", "DequantizeLinear", "Transpose"}
    ops = _int8_onnx_ops(raw, tmp_path / "raw")
    assert {"Mul", "Add"} & set(ops[:ops.index("Conv")]), ops[:ops.index("Conv")]


def _tflite_ops(path) -> list[str]:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    return [op["op_name"] for op in interpreter._get_ops_details()]


def _int8_tflite(model, data: Data, folder, fold: bool = True):
    from compressor.backends.keras import KerasBackend, input_fold
    from compressor.core.context import ModelState
    from compressor.export.int8 import export_checked
    from compressor.schemes import Int8Static, apply_scheme
    from compressor.config.steps import QuantizeConfig

    backend = KerasBackend()
    ctx = helpers.context(data, folder / "work")
    config = QuantizeConfig(mode="ptq", calibration_samples=64)
    state = apply_scheme(backend, ModelState(model=model),
                         Int8Static.from_step(config), ctx).after(config)
    if not fold:
        input_fold._FOLDED[model] = model    # what the route did before the fold
    try:
        return export_checked(backend, state, "tflite", folder / "model.tflite", ctx)
    finally:
        input_fold._FOLDED.pop(model, None)


def test_the_keras_fold_is_exact_with_its_border_map():
    """Rescaling + Normalization + the stem conv ('same' padding, stride 2) + its BatchNorm
    become one conv and a border map (built-in layers: tfmot's QAT wraps them): the folded
    model computes what the original does."""
    import numpy as np

    from compressor.backends.keras.input_fold import input_folded

    model = kal.applications_like()
    raw = kal.quadrant_data(train=32, val=8)
    unit = raw.train[0] / 255.0
    folded = input_folded(model, lambda: {"input": unit})
    assert folded is not model
    kinds = [type(layer).__name__ for layer in folded.layers]
    # the preprocessing became identities, the stem BatchNorm the border map's Normalization
    assert kinds[1:5] == ["Activation", "Activation", "Conv2D", "Normalization"]
    assert kinds.count("Rescaling") == 0 and kinds.count("BatchNormalization") == \
        [type(layer).__name__ for layer in model.layers].count("BatchNormalization") - 1
    want, got = np.asarray(model(unit)), np.asarray(folded(unit))
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()
    assert input_folded(model, lambda: {"input": unit}) is folded   # once per model
    # images in the [0, 255] the preprocessing expects are not a narrow band: no fold
    other = kal.applications_like(seed=1)
    assert input_folded(other, lambda: {"input": raw.train[0]}) is other


@pytest.mark.slow
def test_tflite_int8_of_unit_images_quantizes_the_raw_image(tmp_path):
    """TFLiteConverter quantized the preprocessed band (rescaling MUL / ADD, 2 of 256 levels);
    with the fold the stem CONV_2D reads the quantized raw image, and the int8 file follows the
    float model more closely: max logit error 5.99 -> 3.30 (keras.applications MobileNetV3Small
    on [0, 1] images: accuracy 0.54 -> 0.94 at 64x64, 0.43 -> 1.0 at 32x32; float 1.0, 0.99)."""
    import numpy as np

    from compressor.backends.keras.io import predict

    unit = kal.unit_images(kal.quadrant_data(train=256, val=128))
    model = kal.trained(unit, epochs=8)
    reference = np.asarray(predict(model, unit.val[0]))
    results = {}
    for fold in (False, True):
        path = _int8_tflite(model, unit, tmp_path / f"fold{fold}", fold)
        ops = _tflite_ops(path)
        got = _run_tflite(path, unit.val[0])
        results[fold] = (ops[:ops.index("CONV_2D")], float(np.abs(got - reference).max()),
                         float(np.mean(got.argmax(1) == reference.argmax(1))))
    assert results[True][0] == ["QUANTIZE"], results
    assert "MUL" in results[False][0], results
    assert results[True][1] < 0.7 * results[False][1], results
    assert results[True][2] >= results[False][2], results


def _run_tflite(path, x):
    from compressor.runtimes import open_runtime

    return open_runtime(path, threads=1).predict(x)


@pytest.mark.slow
def test_qat_trains_a_model_whose_stem_reads_the_raw_image(tmp_path):
    """QAT's fake-quant rounded the narrow band in every training step (keras.applications
    MobileNetV3Small 64x64 on [0, 1] images: int8_qat accuracy 0.27 TFLite / 0.26 ONNX, float
    1.0): the fold goes in before QAT (1.0 / 0.99). The model QAT wraps has identities where
    the preprocessing was and the border map where the stem BatchNorm was, and without its
    fake-quant it computes what the original model does."""
    import numpy as np

    from compressor.backends.keras import KerasBackend
    from compressor.backends.keras.io import predict
    from compressor.backends.keras.optimize import without_fake_quant
    from compressor.core.context import ModelState
    from compressor.config.steps import QuantizeConfig

    unit = kal.unit_images(kal.quadrant_data(train=96, val=32))
    model = kal.applications_like()
    ctx = helpers.context(unit, tmp_path / "work")
    qat = helpers.apply(KerasBackend(), ModelState(model=model),
                        QuantizeConfig(mode="qat", epochs=0), ctx).model
    wrapped = {layer.layer.name: type(layer.layer).__name__ for layer in qat.layers
               if hasattr(layer, "layer")}
    assert wrapped["Conv/BatchNorm"] == "Normalization"
    assert "Rescaling" not in {wrapped.get(layer.name) for layer in model.layers[1:3]}
    want = np.asarray(predict(model, unit.val[0]))
    got = np.asarray(predict(without_fake_quant(qat), unit.val[0]))
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()
    # images in the [0, 255] the preprocessing expects: QAT wraps the model as it is
    raw = kal.quadrant_data(train=96, val=32)
    qat = helpers.apply(KerasBackend(), ModelState(model=kal.applications_like(seed=1)),
                        QuantizeConfig(mode="qat", epochs=0),
                        helpers.context(raw, tmp_path / "raw")).model
    assert type(qat.get_layer("quant_Conv/BatchNorm").layer).__name__ == "BatchNormalization"


def _stem_nets():
    from compressor.backends.keras.env import import_tf_keras

    keras = import_tf_keras()
    layers = keras.layers
    keras.utils.set_random_seed(0)
    # Sequential, 'same' padding, BatchNorm after the stem: the border map takes its place
    sequential = keras.Sequential([
        keras.Input((16, 16, 3)), layers.Rescaling(1 / 127.5, offset=-1.0),
        layers.Conv2D(8, 3, strides=2, padding="same", use_bias=False),
        layers.BatchNormalization(), layers.ReLU(), layers.Flatten(), layers.Dense(4)])
    # ConvNeXt's stem: Normalization, a 'valid' patchify conv with a bias, LayerNorm after it:
    # no border effect, so no BatchNorm is needed
    inputs = keras.Input((16, 16, 3))
    x = layers.Normalization(mean=[0.485, 0.456, 0.406], variance=[0.052, 0.050, 0.051])(
        layers.Rescaling(1 / 255)(inputs))
    x = layers.LayerNormalization(epsilon=1e-6)(layers.Conv2D(8, 4, strides=4)(x))
    patchify = keras.Model(inputs, layers.Dense(4)(layers.GlobalAveragePooling2D()(x)))
    return {"sequential": (sequential, "BatchNormalization", "Normalization"),
            "patchify": (patchify, "LayerNormalization", "LayerNormalization")}


@pytest.mark.parametrize("net", ["sequential", "patchify"])
def test_the_keras_fold_on_other_stems(net):
    import numpy as np

    from compressor.backends.keras.input_fold import input_folded

    model, after_before, after_now = _stem_nets()[net]
    unit = kal.unit_images(kal.quadrant_data(train=32, val=8)).train[0]
    folded = input_folded(model, lambda: {"input": unit})
    assert folded is not model
    conv = next(i for i, layer in enumerate(folded.layers) if type(layer).__name__ == "Conv2D")
    assert type(model.layers[conv + 1]).__name__ == after_before
    assert type(folded.layers[conv + 1]).__name__ == after_now
    assert not {"Rescaling"} & {type(layer).__name__ for layer in folded.layers}
    want, got = np.asarray(model(unit)), np.asarray(folded(unit))
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()

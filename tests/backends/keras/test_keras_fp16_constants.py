"""A keras.applications-style net (Rescaling(1/255) + Normalization before the stem conv) fed
images in [0, 1]: its float16 TFLite stores only the conv / dense weights (and embedding
tables) as float16. The converter's own float16 option also rounds the preprocessing constants,
which shifts the narrow band such images become (issue 27 item 6: EfficientNetV2B0 fp16 0.951
vs 0.963 float)."""
from __future__ import annotations

import numpy as np
import pytest
from support import helpers
from support import keras_applications_like as kal

from compressor.core.context import Data


def _float16_exact(model) -> None:
    """Kernels rounded to float16 and BatchNorms that fold into them as identities: storing the
    weights as float16 then loses nothing, so a file differs from float32 only where it rounds
    something else."""
    for layer in model.layers:
        for attr in ("kernel", "depthwise_kernel"):
            if (weight := getattr(layer, attr, None)) is not None:
                weight.assign(weight.numpy().astype(np.float16).astype(np.float32))
        if hasattr(layer, "moving_variance"):
            layer.moving_variance.assign(np.full(layer.moving_variance.shape, 1 - layer.epsilon))


def _logits(content: bytes, images: np.ndarray) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=content)
    index = interpreter.get_input_details()[0]["index"]
    interpreter.resize_tensor_input(index, images.shape)
    interpreter.allocate_tensors()
    interpreter.set_tensor(index, images)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


@pytest.mark.slow
def test_float16_tflite_rounds_weights_not_preprocessing(tmp_path):
    import tensorflow as tf
    from ai_edge_litert.interpreter import Interpreter

    from compressor.backends.keras.mixed import kernel_layer_names
    from compressor.backends.keras.tflite import float16_tflite, float32_tflite
    from compressor.schemes import Float16

    raw = kal.quadrant_data(train=32, val=32)
    unit = Data(train=(raw.train[0] / 255.0, raw.train[1]), val=(raw.val[0] / 255.0, raw.val[1]))
    model = kal.applications_like()
    _float16_exact(model)
    ctx = helpers.context(unit, tmp_path)
    ours = float16_tflite(model, Float16(), ctx)
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.target_spec.supported_types = [tf.float16]

    half = [d for d in Interpreter(model_content=ours).get_tensor_details()
            if d["dtype"] == np.float16]
    assert len(half) == len(kernel_layer_names(model)) == 9    # the conv / dense kernels
    assert min(int(np.prod(d["shape"])) for d in half) >= 27   # no 1- or 3-element constant
    images = unit.val[0].astype(np.float32)
    reference = _logits(float32_tflite(model, ctx), images)
    ours_error = np.abs(_logits(ours, images) - reference).max()
    converter_error = np.abs(_logits(converter.convert(), images) - reference).max()
    print(f"max logit error vs float32: ours {ours_error:.2e}, converter {converter_error:.2e}")
    assert ours_error <= 1e-5 * np.abs(reference).max()
    assert converter_error >= 10 * ours_error, (ours_error, converter_error)

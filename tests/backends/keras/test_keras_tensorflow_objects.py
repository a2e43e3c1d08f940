"""keras.applications' EfficientNetV2 stores `tf.constant_initializer(0)` as an object of module
`tensorflow.python.ops.init_ops_v2`: TensorFlow's own initializers, regularizers and
constraints load without --trust-pickle; any other object of a TensorFlow module (a function,
an op) is still refused as code."""
from __future__ import annotations

import json

import numpy as np
import pytest

from compressor.backends.keras.config_scan import stored_code
from compressor.errors import ModelLoadError


def _object(module: str, class_name: str) -> dict:
    return {"class_name": "Dense", "module": "keras.layers", "config": {
        "name": "head", "units": 3, "bias_initializer": {
            "module": module, "class_name": class_name, "config": {"value": 0},
            "registered_name": class_name}}}


@pytest.mark.parametrize("module, class_name", [
    ("tensorflow.python.ops.init_ops_v2", "Constant"),
    ("tensorflow.python.ops.init_ops", "GlorotUniform"),
    ("tensorflow.python.keras.initializers.initializers_v2", "HeNormal"),
    ("tensorflow.python.keras.regularizers", "L2"),
    ("tensorflow.python.keras.constraints", "MaxNorm"),
])
def test_tensorflow_initializers_regularizers_constraints_are_data(module, class_name, tmp_path):
    assert stored_code(tmp_path / "m.keras", [json.dumps(_object(module, class_name))]) is None


@pytest.mark.parametrize("module, class_name", [
    ("tensorflow.python.ops.init_ops_v2", "constant_initializer"),   # a function, not a class
    ("tensorflow.python.ops.gen_io_ops", "WriteFile"),
    ("tensorflow.python.ops.init_ops_v2", "Initializer"),            # the abstract base
    ("tensorflow", "Constant"),
])
def test_other_tensorflow_objects_are_still_refused(module, class_name, tmp_path):
    found = stored_code(tmp_path / "m.keras", [json.dumps(_object(module, class_name))])
    assert found == f"an object from module {module!r}, which loading would import"


def test_a_model_with_tensorflow_initializers_loads_untrusted(tmp_path):
    """Saved by tf_keras with TensorFlow's own objects (as EfficientNetV2's head is): the file
    names their TensorFlow modules, and it loads without --trust-pickle, computing the same."""
    from compressor.backends.keras.env import import_tf_keras
    from compressor.backends.keras.load import load_keras_model

    keras = import_tf_keras()
    import tensorflow as tf
    from tensorflow.python.keras import constraints, regularizers

    inputs = keras.Input((4,))
    with pytest.warns(UserWarning):   # tf_keras warns that these are not its own classes
        outputs = keras.layers.Dense(3, bias_initializer=tf.constant_initializer(0.5),
                                     kernel_regularizer=regularizers.L2(0.01),
                                     kernel_constraint=constraints.MaxNorm(2.0))(inputs)
        model = keras.Model(inputs, outputs)
        model.save(tmp_path / "m.keras")
    stored = json.loads(__import__("zipfile").ZipFile(tmp_path / "m.keras").read("config.json"))
    dense = stored["config"]["layers"][1]["config"]
    assert dense["bias_initializer"]["module"] == "tensorflow.python.ops.init_ops_v2"
    assert dense["kernel_regularizer"]["module"] == "tensorflow.python.keras.regularizers"
    loaded = load_keras_model(tmp_path / "m.keras")
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
    assert type(loaded.layers[1].kernel_regularizer).__name__ == "L2"


def test_an_unknown_module_still_names_the_fix(tmp_path):
    path = tmp_path / "m.keras"
    found = stored_code(path, [json.dumps(_object("os", "system"))])
    from compressor.backends.keras.config_scan import refused

    error = refused(path, found)
    assert isinstance(error, ModelLoadError) and "--trust-pickle" in str(error)

"""What a stored Keras model asks to run, read from its parsed config before anything loads it.

Loading a Lambda layer runs Python code stored in the file, and legacy .h5 / SavedModel
loading does so without tf_keras' safe mode. So the config is parsed as JSON (any spacing,
any escaping: `\\u004cambda` is `Lambda`) in every format, nested models included, and code is
refused unless the user trusts the file:
- Lambda layers (tf_keras) and serialized Python lambdas (Keras 3 `__lambda__`), or any
  config that stores a function's bytecode;
- objects from modules other than Keras / tf_keras / tfmot (Keras 3 imports the module
  named in the config and may call a function from it), except TensorFlow's own
  initializer, regularizer and constraint classes (`tf.constant_initializer(0)` is stored
  as `tensorflow.python.ops.init_ops_v2.Constant`, e.g. in keras.applications'
  EfficientNetV2): only those classes, named exactly, never a function from the module;
- TF-op layers whose op reads or writes files or calls back into Python (`tf.io.*`,
  `tf.py_function`, ...): they are rebuilt by name from the config.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from compressor.errors import ModelLoadError

CODE_CLASSES = {"Lambda", "__lambda__"}
SAFE_MODULES = ("keras", "tf_keras", "tensorflow_model_optimization")
OP_LAYERS = {"TFOpLambda", "SlicingOpLambda", "ClassMethod", "InstanceMethod", "InstanceProperty"}
UNSAFE_OP_PARTS = ("io.", "py_func", "numpy_function", "py_function", "raw_ops", "print",
                   "summary", "debugging", "saved_model", "load_library", "load_op_library",
                   "gfile", "file", "train.", "data.")
MAX_CONFIG_NESTING = 200
_INITIALIZERS = frozenset({"Constant", "GlorotNormal", "GlorotUniform", "Identity", "Ones",
                           "Orthogonal", "RandomNormal", "RandomUniform", "TruncatedNormal",
                           "VarianceScaling", "Zeros"})
# TensorFlow's own classes (module -> class names) a tf_keras model may store: data-only
# configs, which loading rebuilds as the class itself.
TENSORFLOW_CLASSES = {
    "tensorflow.python.ops.init_ops_v2": _INITIALIZERS,
    "tensorflow.python.ops.init_ops": _INITIALIZERS | {"UniformUnitScaling"},
    "tensorflow.python.keras.initializers.initializers_v2":
        _INITIALIZERS | {"HeNormal", "HeUniform", "LecunNormal", "LecunUniform"},
    "tensorflow.python.keras.initializers.initializers_v1": frozenset({
        "RandomNormal", "RandomUniform", "TruncatedNormal", "HeNormal", "HeUniform",
        "LecunNormal", "LecunUniform"}),
    "tensorflow.python.keras.regularizers": frozenset({"L1", "L2", "L1L2"}),
    "tensorflow.python.keras.constraints": frozenset({"MaxNorm", "MinMaxNorm", "NonNeg",
                                                      "UnitNorm", "RadialConstraint"}),
}


def stored_code(path: Path, config_texts: list[bytes | str]) -> str | None:
    """What in these stored configs would run code (e.g. "Lambda layer 'scale'"), or None.
    A config that is not valid JSON is refused: the loader would read it differently."""
    for text in config_texts:
        try:
            config = json.loads(text)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise ModelLoadError(f"{path}: its stored model config is not valid JSON; save the "
                                 "model again with model.save('model.keras')") from None
        for item in _mappings(config, path):
            found = _code_in(item)
            if found:
                return found
    return None


def _mappings(config: Any, path: Path) -> Iterator[dict]:
    """Every dict in a parsed JSON value (iteratively: configs may nest deeply)."""
    stack = [(config, 0)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_CONFIG_NESTING:
            raise ModelLoadError(f"{path}: its model config nests more than {MAX_CONFIG_NESTING} "
                                 "levels; save the model again with model.save('model.keras')")
        if isinstance(value, dict):
            yield value
            stack.extend((child, depth + 1) for child in value.values())
        elif isinstance(value, list):
            stack.extend((child, depth + 1) for child in value)


def _code_in(item: dict) -> str | None:
    class_name = item.get("class_name")
    name = item.get("config", {}).get("name") if isinstance(item.get("config"), dict) else None
    label = f" {name!r}" if isinstance(name, str) else ""
    if class_name in CODE_CLASSES or item.get("function_type") == "lambda":
        return f"a Lambda layer{label} (Python code stored in the file)"
    module = item.get("module")
    if (isinstance(module, str) and module.split(".")[0] not in SAFE_MODULES
            and class_name not in TENSORFLOW_CLASSES.get(module, ())):
        return f"an object{label} from module {module[:80]!r}, which loading would import"
    if class_name in OP_LAYERS and isinstance(item.get("config"), dict):
        config = item["config"]
        ops = [str(config.get(key, "")) for key in ("function", "symbol", "method_name", "attr_name")]
        bad = next((op for op in ops if any(part in op for part in UNSAFE_OP_PARTS)), None)
        if bad:
            return f"a TensorFlow op layer{label} calling {bad[:80]!r}"
    return None


def refused(path: Path, what: str) -> ModelLoadError:
    return ModelLoadError(f"{path} contains {what}; loading it runs code from the file. Pass "
                          "--trust-pickle if you trust it, or replace it with built-in layers")

"""Lazy, configured imports of TensorFlow, tf_keras and tfmot.

`import compressor` never imports TensorFlow (~2 s) or tfmot (~3 s): every Keras module
reaches them only through these functions, which also set the environment TensorFlow reads
once, at its first import: tfmot needs Keras 2 (`TF_USE_LEGACY_KERAS=1`), and
`TF_CPP_MIN_LOG_LEVEL=2` hides its start-up noise.
"""
from __future__ import annotations

import os
import sys
from types import ModuleType

from compressor.errors import BackendUnavailableError


def _configure_environment() -> None:
    from compressor.core.quiet import hush_libraries

    hush_libraries()
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def import_tensorflow() -> ModuleType:
    _configure_environment()
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    return _first_tensorflow_import()


def _first_tensorflow_import() -> ModuleType:
    """Import TensorFlow and start its runtime with the native start-up noise captured.

    TF_CPP_MIN_LOG_LEVEL does not cover absl's pre-init warnings or the CUDA probes
    ("Could not find cuda drivers", "failed call to cuInit") on CPU-only machines.
    """
    from compressor.core.quiet import log_tail, quiet_import

    with quiet_import("tensorflow") as log:
        try:
            import tensorflow

            tensorflow.config.list_physical_devices()   # the CUDA probe happens here
        except ImportError as exc:
            raise BackendUnavailableError(f"TensorFlow cannot be imported ({exc}); install the "
                                          f"Keras extras: pip install compressor[keras]\n"
                                          f"{log_tail(log)}") from None
    from compressor.backends.keras.distribute import join_workers

    join_workers(tensorflow)   # under TF_CONFIG: before any op runs (collective ops setup)
    return tensorflow


def import_tf_keras() -> ModuleType:
    import_tensorflow()
    import tf_keras

    return tf_keras


def import_tfmot() -> ModuleType:
    import_tensorflow()
    import tensorflow_model_optimization

    return tensorflow_model_optimization


def fake_quant_layer_types() -> tuple[tuple[type, ...], type]:
    """(tfmot's quantize wrappers, the QuantizeLayer quantize_apply puts after each model
    input: not in tfmot's public API)."""
    quantize = import_tfmot().quantization.keras
    from tensorflow_model_optimization.python.core.quantization.keras.quantize_layer import (
        QuantizeLayer,
    )

    return (quantize.QuantizeWrapper, quantize.QuantizeWrapperV2), QuantizeLayer


def is_tf_keras_model(obj: object) -> bool:
    """True for a tf_keras Model, without importing tf_keras when it was never imported."""
    return any(cls.__module__.startswith("tf_keras.") for cls in type(obj).__mro__) and \
        hasattr(obj, "layers")


def is_keras3_model(obj: object) -> bool:
    return any(cls.__module__.startswith("keras.") for cls in type(obj).__mro__) and \
        hasattr(obj, "layers")

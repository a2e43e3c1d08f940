"""Lazy, configured imports for the PyTorch backend, with typed errors for missing packages.

`import compressor` never imports torch (~1 s), torchao (~2.4 s) or litert-torch: the torch
modules reach the optional ones through these functions, which first set the environment
those libraries read once, at import time.
"""
from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import warnings
from types import ModuleType
from collections.abc import Iterator

from compressor.errors import BackendUnavailableError

INSTALL_HINT = "pip install 'compressor[torch]'"
# Loggers that warn at torchao's import: that it skips its CUDA kernels (as asked, on CPU),
# and a torch deprecation torchao triggers. Neither is the user's concern.
IMPORT_NOISE = ("torchao", "torch.utils._pytree")


def configure_environment() -> None:
    from compressor.core.quiet import hush_libraries

    hush_libraries()   # torchao / torch start-up warnings: errors only, unless --debug
    # torchao probes CUDA kernels at import and logs a failure per .so on CPU machines.
    os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")
    # litert-torch imports TensorFlow; the Keras backend (same process) needs Keras 2 there.
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def require(module: str, package: str, purpose: str) -> None:
    """Raise BackendUnavailableError when top-level `module` is not installed."""
    if importlib.util.find_spec(module) is None:
        raise BackendUnavailableError(f"{purpose} needs {package}, which is not installed; "
                                      f"{INSTALL_HINT} (or pip install {package})")


def import_pt2e() -> ModuleType:
    """torchao's PT2E entry points (prepare_pt2e, prepare_qat_pt2e, convert_pt2e)."""
    configure_environment()
    require("torchao", "torchao==0.18.0", "int8 quantization of PyTorch models")
    with quiet_loggers(*IMPORT_NOISE):
        from torchao.quantization.pt2e import quantize_pt2e

    return quantize_pt2e


def xnnpack_quantizer(is_qat: bool, conv_bn_patterns: bool = True) -> object:
    """The PT2E quantizer every torch int8 path uses: XNNPACK-style, per-channel symmetric.

    `conv_bn_patterns=False` skips QAT's conv-BatchNorm annotation, for graphs without BN.

    Per-channel symmetric int8 weights and per-tensor affine int8 activations are what the
    TFLite int8 spec and XNNPACK's ARM kernels (Raspberry Pi 5, phones, Jetson CPUs) run
    natively, and onnxruntime's QDQ kernels run the same. A symmetric weight grid keeps
    pruned zeros exactly zero. torchao's X86InductorQuantizer targets x86 and leaves the last
    Linear float, so it does not suit edge devices. In torchao 0.18 this quantizer lives only
    under torchao.testing (deprecated there in favour of executorch, not installed here).
    """
    import_pt2e()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torchao.testing.pt2e._xnnpack_quantizer import (XNNPACKQuantizer,
                                                              get_symmetric_quantization_config)

        quantizer = XNNPACKQuantizer()
    if not conv_bn_patterns:
        # Matching QAT conv-BN patterns traces 12 pattern graphs (~10 s) even when the model
        # has no BatchNorm; without BN there is nothing for them to find.
        quantizer.STATIC_QAT_ONLY_OPS = []
    return quantizer.set_global(get_symmetric_quantization_config(is_per_channel=True,
                                                                  is_qat=is_qat))


@contextlib.contextmanager
def quiet_loggers(*names: str) -> Iterator[None]:
    """Only errors from these loggers for the duration of the block."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def import_litert_torch() -> ModuleType:
    configure_environment()
    require("litert_torch", "litert-torch==0.10.0", "exporting PyTorch models to TFLite")
    import_pt2e()   # litert-torch imports torchao: quietly first
    from compressor.core.quiet import quiet_import

    # Its native libraries log at import (TensorFlow's oneDNN notice on CPUs with AVX-512 /
    # AMX, after absl's "All log messages before absl::InitializeLog()"), which
    # TF_CPP_MIN_LOG_LEVEL does not stop: the import runs with its output in a log.
    with quiet_import("litert-torch"):
        import litert_torch

    return litert_torch


def import_onnx() -> ModuleType:
    require("onnx", "onnx", "exporting PyTorch models to ONNX")
    require("onnxscript", "onnxscript", "exporting PyTorch models to ONNX (torch.onnx dynamo)")
    import onnx

    return onnx

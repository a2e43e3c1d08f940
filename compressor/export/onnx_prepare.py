"""What every onnxruntime quantization route does first: shape inference and graph
optimization (quant_pre_process), and one typed error for a quantizer that gives up."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compressor.errors import BackendUnavailableError, first_line


def preprocessed(source: Path, target: Path) -> Path:
    """quant_pre_process: symbolic + ONNX shape inference and onnxruntime's basic graph
    optimizations (BatchNorm folded into its conv, constants folded). Symbolic shape
    inference asserts on some ops (e.g. an LSTM with an unused output); ONNX's own shape
    inference is then enough for quantization."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    try:
        quant_pre_process(str(source), str(target))
    except (AssertionError, KeyError, TypeError, ValueError, IndexError, AttributeError):
        quantizing(lambda: quant_pre_process(str(source), str(target), skip_symbolic_shape=True),
                   "pre-processing")
    return target


def quantizing(run: Any, kind: str) -> None:
    try:
        run()
    except (RuntimeError, ValueError, KeyError, TypeError, AssertionError, IndexError) as exc:
        # onnxruntime's pybind errors subclass RuntimeError; its quantizers raise ValueError
        # or assert on graphs they cannot handle.
        raise BackendUnavailableError(
            f"onnxruntime int8 {kind} quantization failed: {first_line(exc)}; an op its "
            "quantizer does not handle is the usual cause: keep that layer float (precision "
            "exclude / quantize fallback: auto), or export tflite only") from None


def prepared_names(prepared: Path, names: Sequence[str]) -> list[str]:
    """`names` (nodes of the original file) as they are called in the pre-processed one:
    onnxruntime names a fused node after the first node it fused, plus a suffix
    ('dense/MatMul' + Add -> Gemm 'dense/MatMul/MatMulAddFusion')."""
    import onnx

    wanted = set(names)
    if not wanted:
        return []
    graph = onnx.load(str(prepared), load_external_data=False).graph
    return [node.name for node in graph.node
            if node.name in wanted or node.name.rsplit("/", 1)[0] in wanted]

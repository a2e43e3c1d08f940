"""Reading exported artifacts back in tests: accuracy in their runtimes, kernels, I/O dtypes."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from compressor.core.context import Data
from compressor.runtimes import inspect_artifact, open_runtime


def score(outputs: np.ndarray, data: Data) -> float:
    return float(np.mean(np.argmax(outputs, axis=-1) == data.val[1]))


def run(path: Path, x: np.ndarray) -> np.ndarray:
    return open_runtime(path, threads=1).predict(x)


def accuracy(path: Path, data: Data) -> float:
    return score(run(path, data.val[0]), data)


def kernels(path: Path, expected: int | None = 4):
    """The conv / dense weights stored in the file (the digits CNN has 2 conv + 2 dense)."""
    found = [w for w in inspect_artifact(path).weights if w.is_kernel]
    assert expected is None or len(found) == expected, f"{len(found)} kernels in {path.name}"
    return found


def kernel_dtypes(path: Path) -> list[str]:
    return [w.dtype for w in kernels(path, expected=None)]


def zero_fraction(found) -> float:
    return sum(k.zeros for k in found) / sum(k.size for k in found)


def size(path: Path) -> int:
    return path.stat().st_size


def io_dtypes(path: Path) -> list[str]:
    info = inspect_artifact(path)
    return [d["dtype"] for d in info.inputs + info.outputs]


def agreement(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean(np.argmax(a, axis=1) == np.argmax(b, axis=1)))


def export_both(backend, state, ctx, folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    return {fmt: backend.export(state, fmt, folder / f"model.{fmt}", ctx)
            for fmt in ("tflite", "onnx")}


FLOAT_KERNEL_OPS = ("Conv", "MatMul", "Gemm", "FusedConv", "FusedGemm", "FusedMatMul")
INT8_KERNEL_OPS = ("QLinearConv", "QLinearMatMul", "QGemm", "ConvInteger", "MatMulInteger")


def onnxruntime_graph(path: Path, tmp: Path) -> tuple[dict[str, int], int]:
    """The graph onnxruntime runs (ORT_ENABLE_EXTENDED, the level without layout-specific
    rewrites): op counts, and how many QuantizeLinear read a DequantizeLinear (a wasted
    dequantize-requantize chain)."""
    from collections import Counter

    import onnx
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp / f"{path.stem}.ort-optimized.onnx")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    graph = onnx.load(options.optimized_model_filepath).graph
    producers = {out: node.op_type for node in graph.node for out in node.output}
    requantized = sum(node.op_type == "QuantizeLinear"
                      and producers.get(node.input[0]) == "DequantizeLinear" for node in graph.node)
    return dict(Counter(node.op_type for node in graph.node)), requantized

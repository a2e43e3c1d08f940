"""What the runtimes report about an artifact (WeightTensor, ArtifactInfo) and run it with
(the Runtime protocol), whatever its format."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from compressor.formats import format_of  # noqa: F401  (the name runtimes have always offered)

# input name -> the shape of one sample (no batch dim), read from the data: fixes the free
# dims (sequence length) that shape inference, and so MAC counts, depend on
SampleShapes = Mapping[str, tuple[int, ...]]


def sample_of(sample_shapes: SampleShapes | None, name: str, only_input: bool
              ) -> tuple[int, ...] | None:
    """The sample shape for input `name`; key "" (data given as one unnamed array) is the
    shape of a file's only input."""
    shapes = sample_shapes or {}
    return shapes.get(name, shapes.get("") if only_input else None)


@dataclass(frozen=True)
class WeightTensor:
    """A constant tensor stored in the artifact."""

    name: str
    dtype: str                 # numpy dtype name as stored: "int8", "float16", "float32", "int32"
    shape: tuple[int, ...]
    zeros: int                 # elements equal to zero (for quantized tensors: to the zero point)
    is_kernel: bool            # the weight input of a conv / depthwise conv / dense / matmul / gemm op
    reader: str = ""           # "OP_TYPE name" of the first op reading it: names a tensor called `const__2`

    @property
    def size(self) -> int:
        return int(np.prod(self.shape)) if self.shape else 1


@dataclass(frozen=True)
class ArtifactInfo:
    """What `compress inspect` shows and report.json records for one artifact."""

    format: str                          # a registered format name (compressor/formats)
    path: Path
    size_bytes: int
    gzip_bytes: int
    sha256: str
    params: int                          # elements in all constant weight tensors
    weight_dtypes: dict[str, float]      # dtype -> fraction of weight elements, e.g. {"int8": 0.99}
    sparsity: float                      # zero fraction over kernel tensors
    ops: dict[str, int]                  # op type -> count
    inputs: list[dict]                   # [{"name", "shape", "dtype"}]
    outputs: list[dict]
    est_peak_memory_bytes: int           # resident weights (with runtime copies) + activations + overhead
    macs: int = 0                        # multiply-accumulates of one sample in conv / dense / matmul ops
    fixed_batch: int | None = None       # the batch size every call must have; None: dynamic
    weights: tuple[WeightTensor, ...] = field(default=(), repr=False)
    storage: dict[str, dict] = field(default_factory=dict)   # GGUF: tensor type -> {tensors,
    #                                    bytes, bits_per_weight}; {} for formats without types


class Runtime(Protocol):
    name: str      # e.g. "ai-edge-litert 2.3.0", "onnxruntime 1.32.0"
    threads: int

    def predict(self, x: np.ndarray, batch_size: int = 64) -> np.ndarray:
        """Float outputs for float inputs; handles int8 I/O (de)quantization itself.

        Multi-input models take a dict name -> array (or a list in input order); multi-output
        models return a list of arrays. Fixed-batch models are fed padded batches.
        """

    def latency_ms(self, x_one: np.ndarray, warmup: int = 10, runs: int = 50) -> dict[str, float]:
        """{"p50": ms, "p90": ms} over batch-1 runs after warm-up."""

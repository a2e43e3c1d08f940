"""What the LLM backend hands between passes and exporters: the loaded causal LM, and its
quantized linear weights.

A quantize pass never rewrites the torch model: it returns a `QuantizedLm` holding, per linear
weight, the integers, scales and zero points the artifact will store. Exporters write those
exact integers (ONNX: a GPTQ-format checkpoint that onnxruntime-genai's builder re-packs as
MatMulNBits without rounding again), so the algorithm that chose them (GPTQ, RTN, a GGUF file's
own grid) decides the artifact's numbers, not the converter.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class QuantizedLinear:
    """One linear weight [N out, K in] on an asymmetric grid, per group of `group_size` inputs:
    w[n, k] = (q[n, k] - zeros[n, k // g]) * scales[n, k // g].

    q: uint8 tensor [N, K] with values 0 .. 2**bits - 1 (unpacked); scales: float32 [N, K/g];
    zeros: uint8 [N, K/g] with values 0 .. 2**bits - 1 (torch tensors, CPU)."""

    q: Any
    scales: Any
    zeros: Any
    bits: int
    group_size: int

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    def dequantize(self) -> Any:
        """The float32 weight the artifact computes with."""
        import torch

        n, k = self.q.shape
        groups = self.q.reshape(n, k // self.group_size, self.group_size).to(torch.float32)
        centred = groups - self.zeros.to(torch.float32)[..., None]
        return (centred * self.scales.to(torch.float32)[..., None]).reshape(n, k)


@dataclass(frozen=True)
class LoadedLm:
    """A causal LM as loaded: the transformers model in its checkpoint's dtype (never a float32
    copy of a bf16 checkpoint), its tokenizer, and where it came from.

    `source`: the Hugging Face folder it was read from (its tokenizer files and config are
    copied into artifacts), None for a model built in Python. `quantized`: parameter name of a
    linear weight (e.g. "model.layers.0.self_attn.q_proj.weight") -> its integers; empty until
    a quantize pass ran. `file_grids`: the integers the source file itself stores (a Q4_0
    .gguf's blocks), which a quantize pass on the same grid keeps instead of rounding again;
    float recipes and the float reference ignore them (the model holds their exact values)."""

    model: Any
    tokenizer: Any
    source: Path | None = None
    quantized: dict[str, QuantizedLinear] = field(default_factory=dict)
    file_grids: dict[str, QuantizedLinear] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def config(self) -> Any:
        return self.model.config

    def grids_on(self, bits: int, group_size: int) -> dict[str, QuantizedLinear]:
        """The file's own grids that are the recipe's (bits, group_size): kept as they are."""
        return {name: grid for name, grid in self.file_grids.items()
                if grid.bits == bits and grid.group_size == group_size}

    def with_quantized(self, quantized: dict[str, QuantizedLinear], note: str | None = None
                       ) -> LoadedLm:
        notes = self.notes + ((note,) if note else ())
        return dataclasses.replace(self, quantized=dict(quantized), notes=notes)

    def dequantized_state_dict(self) -> dict[str, Any]:
        """The model's state_dict with every quantized weight replaced by what the artifact
        computes with (for the torch reference of a quantized model and float routes)."""
        state = dict(self.model.state_dict())
        for name, weight in self.quantized.items():
            state[name] = weight.dequantize().to(state[name].dtype)
        return state

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


@dataclass(frozen=True, init=False, eq=False)
class QuantizedLinear:
    """One linear weight [N out, K in] on an asymmetric grid, per group of `group_size` inputs:
    w[n, k] = (q[n, k] - zeros[n, k // g]) * scales[n, k // g]; or a mixture of experts' E
    such matrices stacked [E, N, K] (transformers 5's experts modules), each on its own grid.

    Held packed, as every artifact stores it (0.5 byte per int4 weight, not 1):
    packed: uint8 tensor [(E,) N, K * bits / 8], 8-bit values one per byte, 4-bit values two per
    byte with input 2i in the low nibble and 2i + 1 in the high one (MatMulNBits' and
    GatherBlockQuantized's layout; read as little-endian int32 words it is GPTQ's qweight,
    transposed); scales: float32 [(E,) N, K/g]; zeros: uint8 [(E,) N, K/g] with values
    0 .. 2**bits - 1, unpacked (torch tensors, CPU). Built from unpacked codes
    (`QuantizedLinear(q, scales, zeros, bits, group_size)`) or from packed bytes
    (`from_packed`); `q` unpacks them again. `transposed`: the model's parameter holds the
    matrix transposed ([K, N]: transformers' Conv1D, GPT-2; [E, K, N]: experts with
    is_transposed), which `parameter()` restores; `dequantize()` is always [(E,) N, K]."""

    packed: Any
    scales: Any
    zeros: Any
    bits: int
    group_size: int
    transposed: bool

    def __init__(self, q: Any, scales: Any, zeros: Any, bits: int, group_size: int,
                 transposed: bool = False):
        """`q`: uint8 [(E,) N, K] codes 0 .. 2**bits - 1, one per weight."""
        self._set(pack_codes(q, bits), scales, zeros, bits, group_size, transposed)

    @classmethod
    def from_packed(cls, packed: Any, scales: Any, zeros: Any, bits: int, group_size: int,
                    transposed: bool = False) -> QuantizedLinear:
        weight = cls.__new__(cls)
        weight._set(packed, scales, zeros, bits, group_size, transposed)
        return weight

    @classmethod
    def stack(cls, experts: list[QuantizedLinear]) -> QuantizedLinear:
        """E matrices [N, K] on one bits / group as one [E, N, K] weight."""
        import torch

        first = experts[0]
        return cls.from_packed(*(torch.stack([getattr(e, key) for e in experts])
                                 for key in ("packed", "scales", "zeros")),
                               first.bits, first.group_size, first.transposed)

    def _set(self, packed: Any, scales: Any, zeros: Any, bits: int, group_size: int,
             transposed: bool) -> None:
        for name, value in (("packed", packed), ("scales", scales), ("zeros", zeros),
                            ("bits", bits), ("group_size", group_size),
                            ("transposed", bool(transposed))):
            object.__setattr__(self, name, value)

    @property
    def shape(self) -> tuple[int, ...]:
        """(N, K), or (E, N, K) for stacked experts."""
        *lead, width = self.packed.shape
        return (*lead, width * 8 // self.bits)

    @property
    def experts(self) -> int | None:
        """E for stacked experts, None for one matrix."""
        return self.packed.shape[0] if self.packed.dim() == 3 else None

    def expert(self, e: int) -> QuantizedLinear:
        """Expert e's [N, K] matrix of stacked experts."""
        return QuantizedLinear.from_packed(self.packed[e], self.scales[e], self.zeros[e],
                                           self.bits, self.group_size, self.transposed)

    def matrices(self) -> list[QuantizedLinear]:
        """The [N, K] matrices: each expert's, or this one."""
        return [self] if self.experts is None else [self.expert(e) for e in range(self.experts)]

    @property
    def q(self) -> Any:
        """The codes unpacked: uint8 [(E,) N, K] (for reading: at 8 bits it is `packed` itself)."""
        return unpack_codes(self.packed, self.bits)

    def dequantize(self) -> Any:
        """The float32 weight the artifact computes with, [(E,) N, K]."""
        import torch

        *lead, k = self.shape
        groups = self.q.reshape(*lead, k // self.group_size, self.group_size).to(torch.float32)
        centred = groups - self.zeros.to(torch.float32)[..., None]
        return (centred * self.scales.to(torch.float32)[..., None]).reshape(*lead, k)

    def parameter(self) -> Any:
        """`dequantize()` in the layout of the model's parameter (transposed back if so)."""
        weight = self.dequantize()
        return weight.transpose(-2, -1).contiguous() if self.transposed else weight


def pack_codes(q: Any, bits: int) -> Any:
    """uint8 codes [(E,) N, K] -> the packed bytes [(E,) N, K * bits / 8]
    (QuantizedLinear.packed)."""
    if bits == 8:
        return q.contiguous()
    if bits != 4 or q.shape[-1] % 2:
        raise ValueError(f"{bits}-bit codes {list(q.shape)} do not pack as 4 or 8 bits per "
                         "weight (4 bits needs an even input width)")
    return (q[..., 0::2] & 0xF) | ((q[..., 1::2] & 0xF) << 4)


def unpack_codes(packed: Any, bits: int) -> Any:
    if bits == 8:
        return packed
    import torch

    return torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(*packed.shape[:-1], -1)


@dataclass(frozen=True)
class LoadedLm:
    """A causal LM as loaded: the transformers model in its checkpoint's dtype (never a float32
    copy of a bf16 checkpoint), its tokenizer, and where it came from.

    `source`: the Hugging Face folder it was read from (its tokenizer files and config are
    copied into artifacts), None for a model built in Python. `quantized`: parameter name of a
    linear weight (e.g. "model.layers.0.self_attn.q_proj.weight") -> its integers; empty until
    a quantize pass ran. `file_grids`: the integers the source file itself stores (a Q4_0
    .gguf's blocks), which a quantize pass on the same grid keeps instead of rounding again;
    float recipes and the float reference ignore them (the model holds their exact values).
    `owned`: the model was loaded here from a file and nothing outside the run holds it, so
    the pages of a linear's float weight may be handed back to the file once it is quantized
    (quantize.py; a caller's in-memory model is never touched)."""

    model: Any
    tokenizer: Any
    source: Path | None = None
    quantized: dict[str, QuantizedLinear] = field(default_factory=dict)
    file_grids: dict[str, QuantizedLinear] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    owned: bool = False

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
        computes with (for the torch reference of a quantized model and float routes); a tied
        table's second name (the lm_head's) gets the same values, or loading it would put the
        float table back."""
        state = dict(self.model.state_dict())
        aliases: dict[int, list[str]] = {}
        for name, param in self.model.named_parameters(remove_duplicate=False):
            aliases.setdefault(id(param), []).append(name)
        params = dict(self.model.named_parameters(remove_duplicate=False))
        for name, weight in self.quantized.items():
            values = weight.parameter().to(state[name].dtype)
            for alias in aliases.get(id(params.get(name)), [name]):
                state[alias] = values
        return state


DEFAULT_CONTEXT_CAP = 4096   # the KV cache an artifact is sized to when the run names none


def run_context(ctx: Any, config: Any) -> int:
    """The KV-cache length every route sizes its artifact to: the run's `context`, else
    min(max_position_embeddings, DEFAULT_CONTEXT_CAP)."""
    limit = int(getattr(config, "max_position_embeddings", None) or DEFAULT_CONTEXT_CAP)
    wanted = getattr(ctx, "context", None)
    return min(int(wanted), limit) if wanted else min(limit, DEFAULT_CONTEXT_CAP)

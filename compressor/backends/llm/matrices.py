"""The weight matrices a decoder layer multiplies with, which the quantizer stores in integers:
nn.Linear ([out, in]), transformers' Conv1D (GPT-2: the parameter is [in, out]) and the 3-D
projections of experts modules (experts.py: [E, out, in], each expert its own matrix); how to
collect their inputs' X^T X (GPTQ) and how to put each on the grid.

A router (a mixture's `gate`: which experts a token goes to) is never among them: in
transformers 5 it is not a linear module, and a linear one (older layouts) beside an experts
module with one row per expert is left out, so routing stays exact.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from compressor.backends.llm.experts import ExpertInputs, is_experts, projections, quantize_experts
from compressor.backends.llm.grid import gptq, gram, rtn
from compressor.backends.llm.model import QuantizedLinear


ACT_ORDER = "gptq_act_order"


@dataclass(frozen=True)
class Matrix:
    """One quantized parameter of a layer: `module.<attr>`, [out, in] ([in, out] when
    `transposed`), or E of them stacked when `experts`."""

    module: Any
    attr: str
    transposed: bool = False
    experts: bool = False

    @property
    def param(self) -> torch.Tensor:
        return getattr(self.module, self.attr)

    @property
    def input_width(self) -> int:
        shape = self.param.shape
        return int(shape[-2] if self.transposed else shape[-1])


def layer_matrices(layer: Any, prefix: str) -> dict[str, Matrix]:
    """Parameter name (under `prefix`, the layer's own name) -> Matrix, in module order."""
    conv1d = _conv1d_class()
    modules = dict(layer.named_modules())
    routers = {_parent(name) for name, module in modules.items() if is_experts(module)}
    found: dict[str, Matrix] = {}
    for name, module in modules.items():
        full = f"{prefix}.{name}" if name else prefix
        if isinstance(module, torch.nn.Linear):
            if _parent(name) in routers and _is_router(module, modules):
                continue
            found[f"{full}.weight"] = Matrix(module, "weight")
        elif conv1d is not None and isinstance(module, conv1d):
            found[f"{full}.weight"] = Matrix(module, "weight", transposed=True)
        elif is_experts(module):
            for attr in projections(module):
                found[f"{full}.{attr}"] = Matrix(module, attr, bool(module.is_transposed), True)
    return found


def _parent(name: str) -> str:
    return name.rpartition(".")[0]


def _is_router(linear: torch.nn.Linear, modules: dict[str, Any]) -> bool:
    experts = [m.num_experts for m in modules.values() if is_experts(m)]
    return linear.out_features in experts


def _conv1d_class() -> type | None:
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:
        return None
    return Conv1D


def input_hessians(matrices: dict[str, Matrix], run: Callable[[], None]) -> dict[str, Any]:
    """X^T X of each matrix's inputs while `run()` runs the layer on the calibration batches:
    name -> [in, in] tensor, or for experts (per-expert [E, in, in], tokens per expert)."""
    sums: dict[str, Any] = {}
    experts: dict[int, ExpertInputs] = {}
    handles = []

    def accumulate(name: str):
        def hook(module: Any, args: tuple, output: Any) -> None:
            sums[name] += gram(args[0])
        return hook

    for name, m in matrices.items():
        if m.experts:
            if id(m.module) not in experts:
                experts[id(m.module)] = ExpertInputs(m.module)
            continue
        sums[name] = torch.zeros(m.input_width, m.input_width)
        handles.append(m.module.register_forward_hook(accumulate(name)))
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
        for inputs in experts.values():
            inputs.remove()
    for name, m in matrices.items():
        if m.experts:
            inputs = experts[id(m.module)]
            first = m.attr == projections(m.module)[0]
            sums[name] = (inputs.first if first else inputs.down, inputs.tokens)
    return sums


def quantize_matrix(m: Matrix, hessian: Any, bits: int, group_size: int, symmetric: bool,
                    algorithm: str = "gptq") -> QuantizedLinear:
    """`m` on the grid: GPTQ where a Hessian is given (per expert: where the expert saw
    enough tokens, experts.py), round to nearest otherwise; `algorithm` "rtn" rounds to
    nearest with the Hessian's diagonal weighting its clip search, ACT_ORDER is GPTQ in order
    of falling input energy on static groups (grid.gptq)."""
    def one(weight: torch.Tensor, h: torch.Tensor | None) -> QuantizedLinear:
        if h is None:
            return rtn(weight, bits, group_size, symmetric)
        if algorithm == "rtn":
            return rtn(weight, bits, group_size, symmetric, importance=torch.diag(h))
        return gptq(weight, h, bits, group_size, symmetric, act_order=algorithm == ACT_ORDER)

    if m.experts:
        hessians, tokens = hessian if hessian is not None else (None, None)
        return quantize_experts(m.param, m.transposed, one, hessians, tokens)
    weight = m.param.T if m.transposed else m.param
    quantized = one(weight, hessian)
    if not m.transposed:
        return quantized
    return QuantizedLinear.from_packed(quantized.packed, quantized.scales, quantized.zeros,
                                       quantized.bits, quantized.group_size, transposed=True)

"""Mixtures of experts: transformers 5's experts modules (Qwen3-MoE, Mixtral, ...) hold every
expert's projections as one 3-D parameter, `gate_up_proj` [E, 2I, H] and `down_proj` [E, H, I]
([E, in, out] where the class says `is_transposed`), not as nn.Linear modules, and route each
token to its top-k experts with a router (`mlp.gate`, weight [E, H]).

Each expert's [out, in] matrix is quantized like any linear, on the same grid (bits, group,
symmetric): GPTQ per expert, from the hidden states the router sent to that expert during
calibration (a forward pre-hook on the experts module reads the tokens, the chosen experts and
their routing weights; each token's row is scaled by its routing weight, since the expert's
output is). An expert that received fewer than MIN_EXPERT_TOKENS calibration tokens has too
little to calibrate on (its Hessian would be mostly damping): it is rounded to nearest (RTN),
as every expert is under `algorithm: rtn`. The router stays float: it is not a linear module
and is never in the quantized names, so its few weights (E x H) pick experts exactly as the
original model does.
"""
from __future__ import annotations

from typing import Any

import torch

from compressor.backends.llm.grid import gram
from compressor.backends.llm.model import QuantizedLinear

MIN_EXPERT_TOKENS = 16    # fewer routed calibration tokens: RTN for that expert


def is_experts(module: Any) -> bool:
    """An experts module of transformers 5 (`@use_experts_implementation`): 3-D projections."""
    return hasattr(module, "has_gate") and hasattr(module, "is_transposed") and \
        isinstance(getattr(module, "down_proj", None), torch.nn.Parameter)


def projections(module: Any) -> tuple[str, str]:
    """The attribute names of the (first, second) projection: gate_up_proj (or up_proj when
    the experts have no gate) and down_proj."""
    return ("gate_up_proj" if module.has_gate else "up_proj"), "down_proj"


def matrix(param: torch.Tensor, expert: int, transposed: bool) -> torch.Tensor:
    """Expert `expert`'s [out, in] matrix of a 3-D projection."""
    weight = param[expert]
    return weight.T if transposed else weight


def first_projection(module: Any, expert: int, x: torch.Tensor) -> torch.Tensor:
    """Expert `expert`'s hidden activations for inputs x [T, H] (float32): the input of its
    down projection."""
    first, _ = projections(module)
    weight = matrix(getattr(module, first), expert, module.is_transposed).to(torch.float32)
    out = x @ weight.T
    if getattr(module, "has_bias", False):
        out = out + getattr(module, f"{first}_bias")[expert].to(torch.float32)
    return module._apply_gate(out) if module.has_gate else module.act_fn(out)


class ExpertInputs:
    """Per-expert X^T X of both projections' inputs while the experts module runs (a forward
    pre-hook): rows are the tokens routed to the expert, each scaled by its routing weight."""

    def __init__(self, module: Any):
        self.module = module
        count = module.num_experts
        first, down = (getattr(module, name) for name in projections(module))
        width_in = first.shape[1] if module.is_transposed else first.shape[2]
        width_mid = down.shape[1] if module.is_transposed else down.shape[2]
        self.first = torch.zeros(count, width_in, width_in)
        self.down = torch.zeros(count, width_mid, width_mid)
        self.tokens = [0] * count
        self.handle = module.register_forward_pre_hook(self._collect, with_kwargs=True)

    def _collect(self, module: Any, args: tuple, kwargs: dict) -> None:
        values = list(args) + [kwargs.get(k) for k in
                               ("hidden_states", "top_k_index", "top_k_weights")[len(args):]]
        hidden, index, weights = values[:3]
        hidden = hidden.reshape(-1, hidden.shape[-1]).to(torch.float32)
        for expert in range(module.num_experts):
            token, slot = torch.where(index == expert)
            if not len(token):
                continue
            scale = weights[token, slot].to(torch.float32)[:, None]
            x = hidden[token]
            self.first[expert] += gram(x * scale)
            self.down[expert] += gram(first_projection(module, expert, x) * scale)
            self.tokens[expert] += len(token)

    def remove(self) -> None:
        self.handle.remove()


def quantize_experts(param: torch.Tensor, transposed: bool, quantize_one: Any,
                     hessians: torch.Tensor | None = None, tokens: list[int] | None = None
                     ) -> QuantizedLinear:
    """Every expert of a 3-D projection on the grid: `quantize_one(matrix, hessian)` with the
    expert's Hessian when it saw at least MIN_EXPERT_TOKENS tokens, else hessian None (RTN)."""
    experts = []
    for expert in range(param.shape[0]):
        calibrated = hessians is not None and tokens is not None and \
            tokens[expert] >= MIN_EXPERT_TOKENS
        experts.append(quantize_one(matrix(param, expert, transposed),
                                    hessians[expert] if calibrated else None))
    stacked = QuantizedLinear.stack(experts)
    return QuantizedLinear.from_packed(stacked.packed, stacked.scales, stacked.zeros,
                                       stacked.bits, stacked.group_size, transposed)

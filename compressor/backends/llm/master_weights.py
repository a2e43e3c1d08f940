"""`precision: bf16` for the language-model training steps: bfloat16 weights computed from
float32 master copies.

Every float parameter stays a float32 leaf (what the optimizer updates, so small steps are
not lost to bfloat16's 8-bit mantissa); the modules read it through a parametrization that
returns its bfloat16 value (fake-quantized ones: FakeQuant's `compute_dtype`, set here). The whole
forward then runs in bfloat16 (the residual stream and every saved activation at 2 bytes;
autocast alone keeps float32 weights and an HF model's float32 residual stream), and the
gradients flow back to the float32 masters through the cast.

`owners` is shared with fake_quant.attach: a tied table is one parameter read by two modules,
and both must see the same parametrization.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.nn.utils import parametrize


class Cast(torch.nn.Module):
    """The parametrization that reads a float32 master as `dtype` (gradient cast back)."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight.to(self.dtype)


def owners(model: torch.nn.Module) -> dict[int, list[tuple[torch.nn.Module, str]]]:
    """id(parameter) -> every (module, attribute) holding it."""
    found: dict[int, list[tuple[torch.nn.Module, str]]] = {}
    for module in model.modules():
        for attribute, param in module.named_parameters(recurse=False):
            found.setdefault(id(param), []).append((module, attribute))
    return found


def parametrize_everywhere(model: torch.nn.Module, param: torch.Tensor, how: torch.nn.Module,
                           held_by: dict[int, list[tuple[torch.nn.Module, str]]]) -> None:
    """`how` on every module attribute holding `param` (one parameter, one parametrization)."""
    for module, attribute in held_by[id(param)]:
        parametrize.register_parametrization(module, attribute, how, unsafe=True)


@contextlib.contextmanager
def bf16_weights(model: torch.nn.Module, enabled: bool) -> Iterator[None]:
    """Inside: every float parameter is read as bfloat16 (its float32 master trains): a plain
    one through a Cast, a parametrized one (FakeQuant) by its own `compute_dtype`. On leaving,
    the casts are removed and the masters are the weights. Nothing when not `enabled`."""
    if not enabled:
        yield
        return
    held_by = owners(model)
    lists = [m for m in model.modules() if isinstance(m, parametrize.ParametrizationList)]
    computing = [p for m in lists for p in m if hasattr(p, "compute_dtype")]
    # a parametrized weight's master and its FakeQuant's scales are read through FakeQuant
    inside = {id(p) for m in lists for p in m.parameters()}
    cast = Cast(torch.bfloat16)
    plain = [p for p in model.parameters()
             if id(p) not in inside and p.is_floating_point() and p.requires_grad]
    for param in plain:
        parametrize_everywhere(model, param, cast, held_by)
    for parametrization in computing:
        parametrization.compute_dtype = torch.bfloat16
    try:
        yield
    finally:
        for parametrization in computing:
            parametrization.compute_dtype = None
        for module, attribute in (held for p in plain for held in held_by[id(p)]):
            parametrize.remove_parametrizations(module, attribute, leave_parametrized=False)

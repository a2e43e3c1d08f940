"""A language model's activations as LiteRT's kernels compute them, emulated in torch.

LiteRT runs a FULLY_CONNECTED with int8 or int4 weights on a float input by quantizing that
input at run time (XNNPACK's qd8: int8 per row, asymmetric, a scale and a zero point from the
row's min and max, zero kept exact), one row per token. On SmolLM2-135M that rounding, not the
weights', is most of the int8 artifact's perplexity increase (measured in torch: int8 weights
alone +0.27%, the inputs rounded too +2.02%; the .tflite scored +2.00%), so candidates meant
for a .tflite are scored with their inputs rounded the same way (Format.lm_activations).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch


def rounded_rows(x: torch.Tensor) -> torch.Tensor:
    """`x` with each row (last axis) put on its own asymmetric int8 grid and read back
    (computed in float32, as the kernel does, whatever `x`'s dtype)."""
    x, dtype = x.float(), x.dtype
    low = x.amin(dim=-1, keepdim=True).clamp(max=0)
    high = x.amax(dim=-1, keepdim=True).clamp(min=0)
    scale = (high - low) / 255
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    zero = torch.clamp(torch.round(-128 - low / scale), -128, 127)
    codes = torch.clamp(torch.round(x / scale) + zero, -128, 127)
    return ((codes - zero) * scale).to(dtype)


def matrix_modules(model: Any, names: Iterable[str]) -> list[torch.nn.Module]:
    """The modules that multiply their input by one of the parameters `names` (a tied
    embedding's table counts as the lm_head's, never as the lookup's)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    wanted = {id(params[name]) for name in names if name in params}
    return [module for module in model.modules()
            if not isinstance(module, torch.nn.Embedding)
            and id(getattr(module, "weight", None)) in wanted]


def int8_inputs(model: Any, names: Iterable[str], straight_through: bool = False
                ) -> contextlib.AbstractContextManager:
    """A context inside which every module computing with one of the quantized parameters
    `names` sees its input rounded as LiteRT rounds it (Format.lm_activations of the TFLite
    route). The modules are found when this is called (by their weights: before QAT's fake
    quantization makes `weight` a computed tensor). `straight_through`: the gradient passes the
    rounding unchanged (QAT trains through it)."""
    modules = matrix_modules(model, names)
    return _hooked(modules, _round_input_straight_through if straight_through else _round_input)


@contextlib.contextmanager
def _hooked(modules: list[torch.nn.Module], hook: Any) -> Iterator[None]:
    handles = [module.register_forward_pre_hook(hook) for module in modules]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _round_input(module: Any, args: tuple) -> tuple:
    return (rounded_rows(args[0]), *args[1:])


def _round_input_straight_through(module: Any, args: tuple) -> tuple:
    x = args[0]
    return (x + (rounded_rows(x.detach()) - x.detach()), *args[1:])

"""Fake quantization of a language model's weight matrices, bit-exactly the grid its artifacts
store (int4 QAT, qat.py): each quantized matrix's forward is (clamp(round(w / s) + z) - z) * s
per group, with s rounded to bfloat16 as the exported scales are, and a straight-through
gradient (the rounding passes the gradient on unchanged; a clamped weight gets none).

The latent weight starts at the starting integers' values (the PTQ result: the clip search's
scales and GPTQ's integers), so before any step the forward is exactly the `int4` model.
`learn_scales`: the group scales are parameters too (their gradient through the straight-through
rounding, as LSQ trains them). `integers()` reads the trained integers back: the same
computation as the forward, so what was trained is what is stored.
"""
from __future__ import annotations

import torch
from torch.nn.utils import parametrize

import compressor.backends.llm.master_weights as master_weights
from compressor.backends.llm.model import QuantizedLinear

SCALE_FLOOR = 2.0 ** -14   # a learned scale never reaches 0 (or a float16 subnormal: GGUF)


def _stored_ste(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`x` as `dtype` holds it in the forward (the scale the artifact stores), gradient as is."""
    return x + (x.to(dtype).to(x.dtype) - x).detach()


def _codes(groups: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, maxq: int
           ) -> torch.Tensor:
    """clamp(round(w / s) + z, 0, maxq): the stored integers, as floats."""
    return torch.clamp(torch.round(groups / scales) + zeros, 0, maxq)


class _GroupFakeQuant(torch.autograd.Function):
    """(clamp(round(w / s) + z, 0, maxq) - z) * s per group, as `dtype`; straight-through for
    the rounding (LSQ's gradient for s). Saves only its inputs (the latent weight is a view of
    the parameter) and recomputes the codes in backward: the autograd graph of the same
    expression held three float32 copies of every matrix (1.8 GB on a 135M model)."""

    @staticmethod
    def forward(ctx, groups: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, maxq: int,
                dtype: torch.dtype) -> torch.Tensor:
        ctx.save_for_backward(groups, scales, zeros)
        ctx.maxq = maxq
        return ((_codes(groups, scales, zeros, maxq) - zeros) * scales).to(dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple:
        groups, scales, zeros = ctx.saved_tensors
        grad = grad.to(torch.float32)
        x = groups / scales
        rounded = torch.round(x)
        shifted = rounded + zeros
        inside = (shifted >= 0) & (shifted <= ctx.maxq)
        grad_groups = torch.where(inside, grad, 0.0)
        grad_scales = None
        if ctx.needs_input_grad[1]:
            # d/ds: the code (q - z) where clamped, (round(x) - x) inside (x passes straight)
            slope = torch.where(inside, rounded - x, shifted.clamp(0, ctx.maxq) - zeros)
            grad_scales = (grad * slope).sum(-1, keepdim=True)
        return grad_groups, grad_scales, None, None, None


class FakeQuant(torch.nn.Module):
    """The parametrization of one [N, K] weight (or its transpose: `transposed`)."""

    def __init__(self, start: QuantizedLinear, learn_scales: bool):
        super().__init__()
        self.bits, self.group, self.transposed = start.bits, start.group_size, start.transposed
        self.register_buffer("zeros", start.zeros.to(torch.float32))
        self.scales = torch.nn.Parameter(start.scales.to(torch.float32).clone(),
                                         requires_grad=learn_scales)
        # int4 scales are bfloat16 as every runtime stores them; an int4 recipe's int8 rows
        # (grid.int8_rows) float16, as GGUF's Q8_0 holds them
        self.scale_dtype = torch.bfloat16 if self.bits == 4 else torch.float16
        # the forward's dtype (None: the weight's); master_weights.bf16_weights sets bfloat16
        self.compute_dtype: torch.dtype | None = None

    def _scales(self) -> torch.Tensor:
        return _stored_ste(self.scales.clamp(min=SCALE_FLOOR), self.scale_dtype)

    def codes(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(codes [N, K/g, g] as floats, the scales used [N, K/g, 1]) of the latent `weight`."""
        scales = self._scales()[..., None]
        return _codes(self._groups(weight), scales, self.zeros[..., None], 2 ** self.bits - 1), scales

    def _groups(self, weight: torch.Tensor) -> torch.Tensor:
        w = weight.transpose(-2, -1) if self.transposed else weight
        n, k = w.shape
        return w.reshape(n, k // self.group, self.group).to(torch.float32)

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        groups = self._groups(weight)
        values = _GroupFakeQuant.apply(groups, self._scales()[..., None], self.zeros[..., None],
                                       2 ** self.bits - 1, self.compute_dtype or weight.dtype)
        values = values.reshape(groups.shape[0], -1)
        return values.transpose(-2, -1) if self.transposed else values

    @torch.no_grad()
    def integers(self, weight: torch.Tensor) -> QuantizedLinear:
        q, scales = self.codes(weight)
        made = QuantizedLinear(q.reshape(q.shape[0], -1).to(torch.uint8),
                               scales[..., 0].contiguous(), self.zeros.to(torch.uint8),
                               self.bits, self.group)
        return QuantizedLinear.from_packed(made.packed, made.scales, made.zeros, self.bits,
                                           self.group, transposed=self.transposed)


def attach(model: torch.nn.Module, start: dict[str, QuantizedLinear], learn_scales: bool
           ) -> dict[str, FakeQuant]:
    """Fake-quantize every parameter in `start` (its latent values set to the starting
    integers' weights); a tied table is one parameter read by two modules, so both get the same
    parametrization. Returns parameter name -> its FakeQuant."""
    held_by = master_weights.owners(model)
    params = dict(model.named_parameters(remove_duplicate=False))
    attached = {}
    for name, weight in start.items():
        if weight.experts is not None:
            raise ValueError(f"{name}: stacked experts are not fake-quantized")
        param = params[name]
        with torch.no_grad():
            param.copy_(weight.parameter().to(param.dtype))
        fake = FakeQuant(weight, learn_scales)
        master_weights.parametrize_everywhere(model, param, fake, held_by)
        attached[name] = fake
    return attached


def detach(model: torch.nn.Module, attached: dict[str, FakeQuant]) -> dict[str, QuantizedLinear]:
    """The trained integers of every fake-quantized parameter, the parametrizations removed
    (the model's float weights are then the latent ones, not used by any artifact)."""
    found = {}
    for module in list(model.modules()):
        if not parametrize.is_parametrized(module):
            continue
        for attribute in list(module.parametrizations.keys()):
            fake = module.parametrizations[attribute][0]
            latent = module.parametrizations[attribute].original
            for name, candidate in attached.items():
                if candidate is fake and name not in found:
                    found[name] = fake.integers(latent)
            parametrize.remove_parametrizations(module, attribute, leave_parametrized=False)
    return found

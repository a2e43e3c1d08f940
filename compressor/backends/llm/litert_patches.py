"""What litert-torch's export_hf needs beyond its own per-family patches, applied in the
converter's child process (litert_convert.py) to the float32 model it traces:

- `one_kv_head_per_query_head`: families whose attention has no grouped-query setting
  (GPT-2, GPT-NeoX: their config class takes no `num_key_value_heads`) get
  num_key_value_heads = num_attention_heads, which litert-torch sizes the KV cache from (it
  reads the attribute unguarded: missing, it fails; a stray one, as transformers keeps any
  unknown key of config.json, sizes a cache the attention does not fill).
- `experts_unstacked`: a mixture of experts traced with static shapes. transformers 5's experts
  implementations do not trace into a file that computes our integers: "grouped_mm" lowers to
  histc (no lowering in litert-torch), "eager" loops over the experts a batch hit (data-
  dependent), and "batched_mm" traces (each token's experts gathered out of the 3-D
  [E, out, in] constants by GATHER_ND, then BATCH_MATMUL) but cannot compute our integers:
  measured on ai-edge-litert 2.3, GATHER_ND refuses INT4 params ("Params of type 'INT4' are
  not supported by gather_nd"), and with INT8 params (one scale per tensor, not our per-block
  grid) the gathered weight is BATCH_MATMUL's left operand, which LiteRT takes only as float
  (int8 only on the right beside a float left), so the experts would stay float32 in the
  file. Here each expert's matrices become their own
  nn.Linear (one FULLY_CONNECTED each, whose constant the route replaces by the expert's int4
  integers, blockwise, like any linear) and every expert runs on every token, its output
  weighted by the token's routing weight (zero for the experts the router did not pick).
  Exact, and static; the cost: E / k times the experts' multiply-adds of a routed kernel (2x
  for the tests' 4 experts, 2 per token; 16x for 128 experts, 8 per token), and decoding
  reads every expert's weights for each token.
"""
from __future__ import annotations

import inspect
import types
from typing import Any

import torch

from compressor.backends.llm.experts import is_experts, matrix, projections


def one_kv_head_per_query_head(config: Any) -> None:
    """num_key_value_heads = num_attention_heads where the config class has no such setting."""
    text = getattr(config, "text_config", None) or config
    if "num_key_value_heads" not in inspect.signature(type(text).__init__).parameters:
        text.num_key_value_heads = text.num_attention_heads


def experts_unstacked(model: Any) -> int:
    """Every experts module of `model` computing densely with one nn.Linear per expert and
    projection (module docstring); returns how many experts modules were rewritten."""
    count = 0
    for module in list(model.modules()):
        if is_experts(module):
            _unstack(module)
            count += 1
    return count


def _unstack(module: Any) -> None:
    first_name, down_name = projections(module)
    transposed = bool(module.is_transposed)
    for name in (first_name, down_name):
        param = getattr(module, name)
        bias = getattr(module, f"{name}_bias", None) if getattr(module, "has_bias", False) \
            else None
        linears = torch.nn.ModuleList()
        for expert in range(param.shape[0]):
            weight = matrix(param.data, expert, transposed)
            linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
            linear.weight = torch.nn.Parameter(weight.contiguous().clone(), requires_grad=False)
            if bias is not None:
                linear.bias = torch.nn.Parameter(bias.data[expert].clone(), requires_grad=False)
            linears.append(linear)
        delattr(module, name)
        if bias is not None:
            delattr(module, f"{name}_bias")
        module.add_module(f"unstacked_{name}", linears)
    module.forward = types.MethodType(_dense_forward, module)


def _dense_forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                   top_k_weights: torch.Tensor) -> torch.Tensor:
    """Every expert on every token [T, H], weighted by the routing weight of its top-k slot
    (0 where the token was not routed to it)."""
    first_name, down_name = projections(self)
    firsts, downs = (getattr(self, f"unstacked_{n}") for n in (first_name, down_name))
    experts = torch.arange(len(firsts), device=hidden_states.device)
    chosen = (top_k_index[..., None] == experts).to(top_k_weights.dtype)   # [T, k, E]
    routing = (chosen * top_k_weights[..., None]).sum(dim=1)                # [T, E]
    out = torch.zeros_like(hidden_states)
    for expert, (first, down) in enumerate(zip(firsts, downs)):
        h = first(hidden_states)
        h = self._apply_gate(h) if self.has_gate else self.act_fn(h)
        h = down(h)
        if getattr(self, "has_post_expert_norm", False):
            h = self.post_expert_norm(h)
        out = out + h * routing[:, expert:expert + 1].to(h.dtype)
    return out

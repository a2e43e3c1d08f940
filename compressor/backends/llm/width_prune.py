"""Width pruning of a causal LM (Minitron-style): `prune` with `structure: channel`.

Each decoder layer loses the same share of MLP channels and of attention KV groups, chosen by
activation importance on the recipe's calibration windows:
- an MLP channel's importance is the mean |activation| of gate(x) * up(x), the input of
  down_proj, over every token;
- a query head's is the mean L2 norm of its attention output (its slice of o_proj's input);
  a KV group's is the sum over the query heads that share it, and a group goes as a whole
  (its k / v head and its query heads), so grouped-query attention stays valid.
The least important go. The result is an ordinary model of the same family: config.json with
intermediate_size, num_attention_heads and num_key_value_heads changed and head_dim written
out (unchanged), weights sliced from the original's, so it reloads in transformers and every
route exports it.

Widths: `sparsity` is the share of the model's parameters removed (the token table and the
norms count, and are not pruned: "prune 30%" leaves about 0.70x the parameters, as a user who
counts parameters means it). Of `n` KV groups, round(sparsity x n) go (halves up; a ratio that
would leave no group is refused); the MLP then loses the channels that bring the whole model to
(1 - sparsity) of its parameters, its kept width rounded to the nearest multiple of the largest
of 128, 64, 32, 16, 8 that divides the original width at least 4 times (128 for SmolLM2's 1536
or any 512-or-wider multiple of 128, so int4 groups of 128 still fit; 32 for the tests' 128-wide
MLP: our int4 group, a GGUF block), never below one multiple (a model whose token table is most
of it cannot lose the whole share: the prune step prints what it reached); the step's
`channel_multiple` (when set above 1) is used instead. A later quantize step whose group does
not divide the kept width is refused before any work (tasks/lm/session.check_quantize_steps).

Layers must be the standard q/k/v/o + gate/up/down linears: a mixture of experts, fused
projections (phi3's qkv_proj / gate_up_proj) or norms over all heads (olmo2) are refused
before any work (`refusal`).
"""
from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
MULTIPLES = (128, 64, 32, 16, 8)
MIN_MULTIPLES = 4   # a multiple is used when the original width holds it this many times
BATCH = 4   # calibration windows per forward while measuring importance


def layers_of(model: Any) -> Any:
    return getattr(getattr(model, "model", None), "layers", None)


def shape_of(config: Any) -> tuple[int, int, int, int]:
    """(query heads, KV heads, head_dim, MLP width) of a config."""
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return heads, kv, head_dim, config.intermediate_size


def refusal(model: Any, sparsity: float | None, channel_multiple: int = 1) -> str | None:
    """Why width pruning cannot run on `model` at `sparsity` (None: it can)."""
    import torch

    family = getattr(model.config, "model_type", "?")
    layers = layers_of(model)
    if layers is None or not len(layers):
        return f"a {family} model has no model.layers to prune"
    for index, layer in enumerate(layers):
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        missing = [f"self_attn.{n}" for n in ATTENTION if not isinstance(
            getattr(attn, n, None), torch.nn.Linear)]
        missing += [f"mlp.{n}" for n in MLP if not isinstance(getattr(mlp, n, None), torch.nn.Linear)]
        if missing:
            kind = ("is a mixture of experts" if hasattr(mlp, "experts") else
                    "has fused projections" if hasattr(attn, "qkv_proj") or hasattr(mlp, "gate_up_proj")
                    else "is not the standard q/k/v/o + gate/up/down linears")
            return (f"{family} layer {index} {kind} (no {', '.join(missing[:3])}); width "
                    "pruning removes MLP channels and attention heads of standard decoder layers")
    if sparsity is None:
        return "width pruning of a language model takes `sparsity`, not target_macs"
    heads, kv, head_dim, width = shape_of(model.config)
    for name in ("q_norm", "k_norm"):
        norm = getattr(layers[0].self_attn, name, None)
        size = getattr(norm, "weight", None)
        if size is not None and size.numel() != head_dim:
            return (f"{family} normalizes all heads together ({name} of {size.numel()}); width "
                    "pruning keeps per-head layers only")
    if kept_groups(kv, sparsity) < 1:
        return (f"sparsity {sparsity:g} removes all {kv} KV groups (round({sparsity:g} x {kv}) = "
                f"{kv}); a sparsity below {(kv - 0.5) / kv:.2f} keeps one: lower it")
    return None


def kept_groups(groups: int, sparsity: float) -> int:
    return groups - math.floor(sparsity * groups + 0.5)


def kept_channels(model: Any, sparsity: float, channel_multiple: int = 1) -> int:
    """The MLP width kept (module docstring): what the parameter share leaves after the KV
    groups went, to the nearest multiple."""
    heads, kv, head_dim, width = shape_of(model.config)
    hidden, layers = model.config.hidden_size, len(layers_of(model))
    per_group = (2 * heads // kv + 2) * head_dim * hidden      # q, o and k, v rows of a group
    left = sparsity * params(model) - layers * (kv - kept_groups(kv, sparsity)) * per_group
    channels_out = max(left, 0.0) / (layers * 3 * hidden)       # gate, up rows and down columns
    multiple = channel_multiple if channel_multiple > 1 else next(
        (m for m in MULTIPLES if width % m == 0 and width >= MIN_MULTIPLES * m), 1)
    kept = math.floor((width - channels_out) / multiple + 0.5) * multiple
    return min(width, max(multiple, kept))


def importance(model: Any, windows: np.ndarray) -> tuple[list[Any], list[Any]]:
    """Per layer: (MLP channel importance [width], query head importance [heads]), the mean
    |gate * up| and the mean L2 norm of each head's attention output over the windows' tokens."""
    import torch

    heads, _, head_dim, _ = shape_of(model.config)
    layers = layers_of(model)
    mlp = [torch.zeros(layer.mlp.down_proj.in_features, dtype=torch.float64) for layer in layers]
    att = [torch.zeros(heads, dtype=torch.float64) for _ in layers]
    tokens = [0]

    def on_mlp(i: int):
        def hook(module: Any, args: tuple) -> None:
            mlp[i] += args[0].detach().abs().double().reshape(-1, args[0].shape[-1]).sum(0)
        return hook

    def on_attention(i: int):
        def hook(module: Any, args: tuple) -> None:
            x = args[0].detach().double().reshape(-1, heads, head_dim)
            att[i] += x.norm(dim=-1).sum(0)
        return hook

    handles = [h for i, layer in enumerate(layers) for h in (
        layer.mlp.down_proj.register_forward_pre_hook(on_mlp(i)),
        layer.self_attn.o_proj.register_forward_pre_hook(on_attention(i)))]
    try:
        with torch.no_grad():
            for start in range(0, len(windows), BATCH):
                ids = torch.as_tensor(windows[start:start + BATCH])
                model(input_ids=ids, use_cache=False)
                tokens[0] += ids.numel()
    finally:
        for handle in handles:
            handle.remove()
    return [m / tokens[0] for m in mlp], [a / tokens[0] for a in att]


def plan(model: Any, windows: np.ndarray, sparsity: float, channel_multiple: int = 1
         ) -> list[tuple[Any, Any]]:
    """Per layer, the (MLP channels, KV groups) kept: sorted index tensors of the most
    important ones."""
    import torch

    heads, kv, _, _ = shape_of(model.config)
    channels, groups = kept_channels(model, sparsity, channel_multiple), kept_groups(kv, sparsity)
    mlp, att = importance(model, windows)
    kept = []
    for channel_scores, head_scores in zip(mlp, att):
        group_scores = head_scores.reshape(kv, heads // kv).sum(-1)
        kept.append((torch.sort(torch.topk(channel_scores, channels).indices).values,
                     torch.sort(torch.topk(group_scores, groups).indices).values))
    return kept


def pruned_model(model: Any, kept: list[tuple[Any, Any]]) -> Any:
    """A new model of `model`'s class with only the `kept` channels and KV groups (the original
    is not changed)."""
    import torch

    heads, kv, head_dim, _ = shape_of(model.config)
    per_group = heads // kv
    channels, groups = len(kept[0][0]), len(kept[0][1])
    config = copy.deepcopy(model.config)
    config.intermediate_size = channels
    config.num_attention_heads = groups * per_group
    config.num_key_value_heads = groups
    config.head_dim = head_dim
    config._name_or_path = ""
    state = dict(model.state_dict())
    for index, (channel_idx, group_idx) in enumerate(kept):
        head_idx = (group_idx[:, None] * per_group + torch.arange(per_group)).reshape(-1)
        q_rows = _rows(head_idx, head_dim)
        kv_rows = _rows(group_idx, head_dim)
        prefix = f"model.layers.{index}."
        for name, rows, dim in (("self_attn.q_proj", q_rows, 0), ("self_attn.k_proj", kv_rows, 0),
                                ("self_attn.v_proj", kv_rows, 0), ("self_attn.o_proj", q_rows, 1),
                                ("mlp.gate_proj", channel_idx, 0), ("mlp.up_proj", channel_idx, 0),
                                ("mlp.down_proj", channel_idx, 1)):
            for part in ("weight", "bias"):
                key = f"{prefix}{name}.{part}"
                if key in state and (part == "weight" or dim == 0):
                    state[key] = state[key].index_select(dim, rows).contiguous()
    dtype = next(model.parameters()).dtype
    pruned = type(model)(config).to(dtype)
    pruned.load_state_dict(state, strict=True)
    pruned.tie_weights()
    return pruned.eval()


def _rows(index: Any, size: int) -> Any:
    import torch

    return (index[:, None] * size + torch.arange(size)).reshape(-1)


def params(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())

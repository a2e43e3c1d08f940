"""What a decoder's layers see on calibration text: layer 0's inputs (the embedded windows and
the keyword arguments the model passes every layer), one layer's outputs, and the final norm
that feeds the lm_head. GPTQ and the int8 ranking (quantize.py) walk the layers with them."""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

CALIBRATION_BATCH = 4      # windows per forward pass


class _Captured(Exception):
    """Raised by the layer-0 hook: the inputs are what we came for."""


def layer0_inputs(model: Any, layers: torch.nn.ModuleList, calibration: np.ndarray
                  ) -> tuple[list[torch.Tensor], dict[str, Any]]:
    """Layer 0's hidden states per calibration batch, and the keyword arguments the model
    passes every layer (position embeddings, mask) — the same for every batch of one shape."""
    hidden: list[torch.Tensor] = []
    kwargs: dict[str, Any] = {}

    def capture(module: Any, args: tuple, call_kwargs: dict) -> None:
        hidden.append(args[0] if args else call_kwargs.pop("hidden_states"))
        kwargs.update({k: v for k, v in call_kwargs.items() if k != "hidden_states"})
        raise _Captured

    handle = layers[0].register_forward_pre_hook(capture, with_kwargs=True)
    try:
        for start in range(0, len(calibration), CALIBRATION_BATCH):
            batch = torch.as_tensor(calibration[start:start + CALIBRATION_BATCH])
            with contextlib.suppress(_Captured):
                model(input_ids=batch, use_cache=False)
    finally:
        handle.remove()
    if len({h.shape for h in hidden}) > 1:   # a short last batch: its mask shape differs
        hidden = [h for h in hidden if h.shape == hidden[0].shape]
    return hidden, kwargs


def run_layer(layer: Any, hidden: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
    out = layer(hidden, **kwargs)
    return out[0] if isinstance(out, tuple) else out


def final_norm(model: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    for attr in ("norm", "final_layernorm", "final_layer_norm", "ln_f"):
        if hasattr(base, attr):
            return getattr(base, attr)
    return lambda x: x

"""Weight-only quantization of a causal LM, one decoder layer at a time.

Which weights: every linear in the decoder layers (nn.Linear, GPT-2's Conv1D, each expert of
a mixture's experts module: matrices.py, experts.py; a router stays float) and the lm_head (a
tied embedding is the lm_head's matrix: the artifact stores it once, quantized); an untied
embedding table is put on the same grid by round to nearest (its rows are gathered, never
multiplied, so no calibration applies). Tensors already on the recipe's grid (a Q4_0 GGUF
file's) are kept.

GPTQ needs each linear's input statistics with the layers before it already quantized, so
layers are calibrated in order: the calibration windows' hidden states enter layer 0, each
layer's linears are quantized from the inputs they saw, and the layer's outputs with its
quantized weights feed the next layer. The model's own tensors are swapped for the quantized
ones only while its layer runs and are restored after: the caller's model is unchanged, and
there is never a second copy of the whole model (peak memory: the model + one layer). A model
loaded here from a checkpoint gives each float weight's pages back to the file once its
integers exist (`_releaser`).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from compressor.backends.llm.grid import gptq, gram, rtn
from compressor.backends.llm.matrices import Matrix, input_hessians, layer_matrices, quantize_matrix
from compressor.backends.llm.model import LoadedLm, QuantizedLinear
from compressor.core.memory import release_file_pages, trim_heap
from compressor.decoders.storage import fitted_group

CALIBRATION_BATCH = 4      # windows per forward pass


@dataclass(frozen=True)
class WeightOnlyPlan:
    """What to quantize how: bits, group size, algorithm (gptq | rtn), symmetric grid; made
    from the scheme's storage (handlers.weight_only_plan)."""

    bits: int
    group_size: int
    algorithm: str = "gptq"
    symmetric: bool = False


def quantize_lm(loaded: LoadedLm, plan: WeightOnlyPlan, calibration: np.ndarray | None,
                task: Callable[[str, int], Any] | None = None) -> dict[str, QuantizedLinear]:
    """Parameter name -> QuantizedLinear for every weight the artifact stores in integers.
    `calibration`: token windows [n, T] (GPTQ); `task(description, total)`: a progress
    context yielding advance() (Progress.task)."""
    model = loaded.model
    kept = loaded.grids_on(plan.bits, plan.group_size)
    layers = decoder_layers(model)
    release = _releaser(loaded)
    with torch.no_grad(), _progress(task, "quantize", len(layers) + 1) as advance:
        if plan.algorithm == "gptq" and calibration is not None:
            quantized = _gptq_layers(model, layers, plan, calibration, kept, advance, release)
        else:
            quantized = _rtn_all(model, plan, kept, advance, release)
    trim_heap()
    return {**quantized, **kept}


def _releaser(loaded: LoadedLm) -> Callable[[torch.Tensor], None]:
    """What is done with a float weight once its integers exist: a model loaded here from a
    checkpoint (LoadedLm.owned) hands its memory-mapped pages back to the file (they are read
    again if anything touches the weight), so the float model and its integers are never
    resident together; a caller's model is left as it is."""
    if not loaded.owned:
        return lambda weight: None
    return lambda weight: release_file_pages(weight.data_ptr(),
                                             weight.numel() * weight.element_size())


def check_grid_fits(loaded: LoadedLm, plan: WeightOnlyPlan | None) -> None:
    """Every quantized weight's input width must be a whole number of groups (odd widths:
    a smaller power-of-two group that divides them all)."""
    from compressor.errors import RecipeError

    if plan is None:
        return
    widths = _input_widths(loaded)
    odd = [k for k in widths if k % plan.group_size]
    if odd:
        fits = widest_group(loaded, plan.group_size)
        fix = f"use group_size: {fits}" if fits else "this model's widths fit no int4 group"
        raise RecipeError(f"quantize group_size {plan.group_size} does not divide the input "
                          f"width {odd[0]} of this model's linears; {fix}")


def widest_group(loaded: LoadedLm, largest: int) -> int | None:
    """The largest power-of-two group size up to `largest` dividing every input width
    (None below 16: the kernels' smallest block): the rule the planner applies to a model's
    shape for a `fit_group` storage (decoders/storage.py)."""
    return fitted_group(largest, _input_widths(loaded))


def _input_widths(loaded: LoadedLm) -> list[int]:
    model = loaded.model
    params = dict(model.named_parameters(remove_duplicate=False))
    matrices = _all_matrices(model)
    return sorted({matrices[name].input_width if name in matrices else params[name].shape[1]
                   for name in quantized_weight_names(model)})


def decoder_layers(model: Any) -> torch.nn.ModuleList:
    """The decoder's repeated blocks (model.model.layers in every family we take)."""
    count = model.config.num_hidden_layers
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == count:
            return module
    raise ValueError(f"no list of {count} decoder layers in {type(model).__name__}")


def quantized_weight_names(model: Any) -> list[str]:
    """The parameter names the artifact stores in integers: decoder linears (experts: one 3-D
    parameter per projection), the lm_head, and an untied input embedding."""
    names = list(_all_matrices(model))
    head = model.get_output_embeddings()
    names.append(_param_name(model, head.weight))
    embedding = model.get_input_embeddings().weight
    if embedding is not head.weight:
        names.append(_param_name(model, embedding))
    return names


def _all_matrices(model: Any) -> dict[str, Matrix]:
    layers = decoder_layers(model)
    prefix = _prefix_of(model, layers)
    return {name: m for index, layer in enumerate(layers)
            for name, m in layer_matrices(layer, f"{prefix}.{index}").items()}


def _prefix_of(model: Any, layers: torch.nn.ModuleList) -> str:
    return next(name for name, module in model.named_modules() if module is layers)


def _param_name(model: Any, param: torch.Tensor) -> str:
    return next(name for name, p in model.named_parameters(remove_duplicate=False) if p is param)


def _rtn_all(model: Any, plan: WeightOnlyPlan, kept: dict[str, QuantizedLinear],
             advance: Callable[[int], None], release: Callable[[torch.Tensor], None]
             ) -> dict[str, QuantizedLinear]:
    params = dict(model.named_parameters(remove_duplicate=False))
    matrices = _all_matrices(model)
    quantized = {}
    for name in quantized_weight_names(model):
        if name not in kept:
            quantized[name] = quantize_matrix(matrices[name], None, plan.bits, plan.group_size,
                                              plan.symmetric) if name in matrices else \
                rtn(params[name], plan.bits, plan.group_size, plan.symmetric)
        release(params[name])
    advance(len(decoder_layers(model)) + 1)
    return quantized


def _gptq_layers(model: Any, layers: torch.nn.ModuleList, plan: WeightOnlyPlan,
                 calibration: np.ndarray, kept: dict[str, QuantizedLinear],
                 advance: Callable[[int], None], release: Callable[[torch.Tensor], None]
                 ) -> dict[str, QuantizedLinear]:
    prefix = _prefix_of(model, layers)
    hidden, layer_kwargs = _layer0_inputs(model, layers, calibration)
    quantized: dict[str, QuantizedLinear] = {}
    for index, layer in enumerate(layers):
        matrices = layer_matrices(layer, f"{prefix}.{index}")
        def run_layer(layer=layer, hidden=hidden) -> list[torch.Tensor]:   # this layer's inputs
            return [_run(layer, h, layer_kwargs) for h in hidden]

        hessians = input_hessians(matrices, run_layer)
        for name, m in matrices.items():
            quantized[name] = kept.get(name) or quantize_matrix(
                m, hessians[name], plan.bits, plan.group_size, plan.symmetric)
        params = {name: m.param for name, m in matrices.items()}
        with _swapped(params, quantized):
            hidden = [_run(layer, h, layer_kwargs) for h in hidden]
        for param in params.values():
            release(param)
        advance(1)
    head = model.get_output_embeddings()
    head_name = _param_name(model, head.weight)
    norm = _final_norm(model)
    head_inputs = [norm(h) for h in hidden]
    hessian = sum(gram(x) for x in head_inputs)
    quantized[head_name] = kept.get(head_name) or gptq(head.weight, hessian, plan.bits,
                                                       plan.group_size, plan.symmetric)
    release(head.weight)
    embedding = model.get_input_embeddings().weight
    if embedding is not head.weight:
        name = _param_name(model, embedding)
        quantized[name] = kept.get(name) or rtn(embedding, plan.bits, plan.group_size,
                                                plan.symmetric)
        release(embedding)
    advance(1)
    return quantized


class _Captured(Exception):
    """Raised by the layer-0 hook: the inputs are what we came for."""


def _layer0_inputs(model: Any, layers: torch.nn.ModuleList, calibration: np.ndarray
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


def _run(layer: Any, hidden: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
    out = layer(hidden, **kwargs)
    return out[0] if isinstance(out, tuple) else out


def quantized_weights(loaded: LoadedLm) -> contextlib.AbstractContextManager:
    """The torch model computing with `loaded.quantized` inside the block (what the artifact
    computes), its own weights after."""
    params = dict(loaded.model.named_parameters(remove_duplicate=False))
    return _swapped({name: params[name] for name in loaded.quantized}, loaded.quantized)


@contextlib.contextmanager
def _swapped(params: dict[str, torch.Tensor], quantized: dict[str, QuantizedLinear]
             ) -> Iterator[None]:
    originals = {name: param.data for name, param in params.items()}
    try:
        for name, param in params.items():
            param.data = quantized[name].parameter().to(param.dtype)
        yield
    finally:
        for name, param in params.items():
            param.data = originals[name]


def _final_norm(model: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    for attr in ("norm", "final_layernorm", "final_layer_norm", "ln_f"):
        if hasattr(base, attr):
            return getattr(base, attr)
    return lambda x: x


@contextlib.contextmanager
def _progress(task: Callable[[str, int], Any] | None, description: str, total: int
              ) -> Iterator[Callable[[int], None]]:
    if task is None:
        yield lambda n=1: None
        return
    with task(description, total) as advance:
        yield advance

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
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from compressor.backends.llm.grid import gptq, gram, output_error, rtn
from compressor.backends.llm.layer_inputs import final_norm, layer0_inputs, run_layer
from compressor.backends.llm.matrices import (ACT_ORDER, Matrix, input_hessians, layer_matrices,
                                             quantize_matrix)
from compressor.backends.llm.model import LoadedLm, QuantizedLinear
from compressor.core.memory import release_file_pages, trim_heap
from compressor.decoders.storage import fitted_group



@dataclass(frozen=True)
class WeightOnlyPlan:
    """What to quantize how: bits, group size, algorithm (gptq | rtn | auto: candidates.py
    tries both), symmetric grid, and the bytes an int4 plan may spend on keeping its costliest
    matrices at int8 (int8_budget x the all-int4 bytes, mixed.py); made from the scheme's
    storage (handlers.weight_only_plan)."""

    bits: int
    group_size: int
    algorithm: str = "gptq"
    symmetric: bool = False
    int8_budget: float = 1.0


@dataclass
class Candidate:
    """One algorithm's integers, and how far each matrix's outputs moved (grid.output_error,
    filled when measured): what mixed.py ranks matrices by."""

    weights: dict[str, QuantizedLinear] = field(default_factory=dict)
    errors: dict[str, float] = field(default_factory=dict)


def quantize_lm(loaded: LoadedLm, plan: WeightOnlyPlan, calibration: np.ndarray | None,
                task: Callable[[str, int], Any] | None = None) -> dict[str, QuantizedLinear]:
    """Parameter name -> QuantizedLinear for every weight the artifact stores in integers.
    `calibration`: token windows [n, T] (GPTQ); `task(description, total)`: a progress
    context yielding advance() (Progress.task)."""
    made = quantize_candidates(loaded, plan, calibration, (plan.algorithm,), task)
    return made[plan.algorithm].weights


def quantize_candidates(loaded: LoadedLm, plan: WeightOnlyPlan, calibration: np.ndarray | None,
                        algorithms: tuple[str, ...], task: Callable[[str, int], Any] | None = None,
                        measure: bool = False) -> dict[str, Candidate]:
    """One Candidate per algorithm, from one pass over the layers: with calibration windows
    and GPTQ among them, each layer's inputs are collected once and every algorithm puts the
    layer on the grid from them (RTN then weights its clip search by the inputs' mean square);
    the first algorithm's integers make the next layer's inputs. `measure`: fill errors."""
    model = loaded.model
    kept = loaded.grids_on(plan.bits, plan.group_size)
    layers = decoder_layers(model)
    release = _releaser(loaded)
    made = {algorithm: Candidate() for algorithm in algorithms}
    with torch.no_grad(), progress(task, "quantize", len(layers) + 1) as advance:
        if any(a.startswith("gptq") for a in algorithms) and calibration is not None:
            _calibrated_layers(model, layers, plan, calibration, made, kept, advance, release,
                               measure)
        else:
            _rounded_all(model, plan, made, kept, advance, release, measure)
    trim_heap()
    for candidate in made.values():
        candidate.weights.update(kept)
    return made


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


def _rounded_all(model: Any, plan: WeightOnlyPlan, made: dict[str, Candidate],
                 kept: dict[str, QuantizedLinear], advance: Callable[[int], None],
                 release: Callable[[torch.Tensor], None], measure: bool) -> None:
    """Round to nearest, no calibration (every candidate gets the same integers)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    matrices = _all_matrices(model)
    for name in quantized_weight_names(model):
        if name not in kept:
            m = matrices.get(name)
            weight = quantize_matrix(m, None, plan.bits, plan.group_size, plan.symmetric) \
                if m is not None else rtn(params[name], plan.bits, plan.group_size, plan.symmetric)
            for candidate in made.values():
                _add(candidate, name, weight, _float_matrix(m, params[name]), None, measure)
        release(params[name])
    advance(len(decoder_layers(model)) + 1)


def _calibrated_layers(model: Any, layers: torch.nn.ModuleList, plan: WeightOnlyPlan,
                       calibration: np.ndarray, made: dict[str, Candidate],
                       kept: dict[str, QuantizedLinear], advance: Callable[[int], None],
                       release: Callable[[torch.Tensor], None], measure: bool) -> None:
    prefix = _prefix_of(model, layers)
    leading = made[next(iter(made))].weights
    hidden, layer_kwargs = layer0_inputs(model, layers, calibration)
    grid = (plan.bits, plan.group_size, plan.symmetric)
    for index, layer in enumerate(layers):
        matrices = layer_matrices(layer, f"{prefix}.{index}")
        def layer_pass(layer=layer, hidden=hidden) -> list[torch.Tensor]:   # this layer's inputs
            return [run_layer(layer, h, layer_kwargs) for h in hidden]

        hessians = input_hessians(matrices, layer_pass)
        for name, m in matrices.items():
            for algorithm, candidate in made.items():
                weight = kept.get(name) or quantize_matrix(m, hessians[name], *grid, algorithm)
                _add(candidate, name, weight, _float_matrix(m, m.param),
                     None if m.experts else hessians[name], measure and name not in kept)
        params = {name: m.param for name, m in matrices.items()}
        with _swapped(params, leading):
            hidden = [run_layer(layer, h, layer_kwargs) for h in hidden]
        for param in params.values():
            release(param)
        advance(1)
    head = model.get_output_embeddings()
    head_name = _param_name(model, head.weight)
    norm = final_norm(model)
    hessian = sum(gram(norm(h)) for h in hidden)
    for algorithm, candidate in made.items():
        weight = kept.get(head_name) or (
            rtn(head.weight, *grid, importance=torch.diag(hessian)) if algorithm == "rtn"
            else gptq(head.weight, hessian, *grid, act_order=algorithm == ACT_ORDER))
        _add(candidate, head_name, weight, head.weight, hessian, measure and head_name not in kept)
    release(head.weight)
    embedding = model.get_input_embeddings().weight
    if embedding is not head.weight:
        name = _param_name(model, embedding)
        weight = kept.get(name) or rtn(embedding, *grid)
        for candidate in made.values():
            _add(candidate, name, weight, embedding, None, measure and name not in kept)
        release(embedding)
    advance(1)


def _float_matrix(m: Matrix | None, param: torch.Tensor) -> torch.Tensor | None:
    """The float weight as [N, K] (None for experts: they are not ranked for int8)."""
    if m is None:
        return param
    if m.experts:
        return None
    return param.T if m.transposed else param


def _add(candidate: Candidate, name: str, weight: QuantizedLinear, original: torch.Tensor | None,
         hessian: torch.Tensor | None, measure: bool) -> None:
    candidate.weights[name] = weight
    if measure and original is not None:
        importance = None if hessian is None else torch.diag(hessian)
        candidate.errors[name] = output_error(original, weight, importance)


def quantized_weights(loaded: LoadedLm) -> contextlib.AbstractContextManager:
    """The torch model computing with `loaded.quantized` inside the block (what the artifact
    computes), its own weights after."""
    return computing_with(loaded.model, loaded.quantized)


def computing_with(model: Any, weights: dict[str, QuantizedLinear]
                   ) -> contextlib.AbstractContextManager:
    """`model` computing with `weights` (parameter name -> integers) inside the block."""
    params = dict(model.named_parameters(remove_duplicate=False))
    return _swapped({name: params[name] for name in weights}, weights)


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


@contextlib.contextmanager
def progress(task: Callable[[str, int], Any] | None, description: str, total: int
             ) -> Iterator[Callable[[int], None]]:
    """`task(description, total)`'s advance(n) (Progress.task), or a no-op without one."""
    if task is None:
        yield lambda n=1: None
        return
    with task(description, total) as advance:
        yield advance

"""A PyTorch model's named inputs and outputs.

Inputs are forward()'s parameters: a dict of arrays is matched to them by name (by position
when the names differ) and passed positionally. Outputs may be a tensor, a tuple / list /
namedtuple, a dict or a Hugging Face ModelOutput (None entries dropped); they are flattened
into named tensors: `output` for one tensor, `output_0`, `output_1`, ... for sequences, the
keys for mappings (`last_hidden_state`, ...). `FlatIO` gives exporters and torch.export a
module with positional inputs and a flat tuple of outputs.
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from compressor.core.tensors import Arrays, matched

SINGLE_OUTPUT = "output"


def as_tensor(x: np.ndarray) -> torch.Tensor:
    """Float inputs as float32, integer inputs (token ids, masks) as int64, as torch expects."""
    x = np.asarray(x)
    dtype = np.float32 if np.issubdtype(x.dtype, np.floating) else np.int64
    return torch.from_numpy(np.ascontiguousarray(x, dtype=dtype))


def input_names(model: torch.nn.Module) -> list[str]:
    """forward()'s positional parameter names (an exported graph: its placeholders)."""
    if isinstance(model, torch.fx.GraphModule):
        names = [n.name for n in model.graph.nodes if n.op == "placeholder" and "val" in n.meta]
        if names:
            return names
    try:
        parameters = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return ["input"]
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = [p.name for p in parameters if p.kind in kinds]
    return names or ["input"]


def as_tensors(model: torch.nn.Module, x: Arrays,
               names: Sequence[str] | None = None) -> list[torch.Tensor]:
    """The model's positional inputs for x (one array, or a dict name -> array matched to
    `names`, by default forward()'s parameters)."""
    if not isinstance(x, Mapping):
        return [as_tensor(x)]
    names = list(names or input_names(model)[:len(x)])
    return [as_tensor(a) for a in matched(x, names)]


def feed_names(model: torch.nn.Module, x: Arrays) -> list[str]:
    """The names x's arrays are fed under: the data's own names for a module whose forward()
    takes them, an exported graph's placeholders (in its order) otherwise."""
    if not isinstance(x, Mapping):
        return ["input"]
    if not isinstance(model, torch.fx.GraphModule) and set(x) <= set(input_names(model)):
        return list(x)
    return input_names(model)[:len(x)]


def call(model: torch.nn.Module, tensors: Sequence[torch.Tensor], names: Sequence[str]) -> Any:
    """model(...) on tensors named `names`: by keyword when every name is a forward()
    parameter (so optional ones in between, e.g. a BERT's attention_mask, may be left out),
    else positionally (exported graphs, or data named otherwise)."""
    if len(tensors) > 1 and not isinstance(model, torch.fx.GraphModule) \
            and set(names) <= set(input_names(model)):
        return model(**dict(zip(names, tensors)))
    return model(*tensors)


def flat_outputs(outputs: Any, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor in the model's output structure, in order."""
    if isinstance(outputs, torch.Tensor):
        return [(prefix or SINGLE_OUTPUT, outputs)]
    if isinstance(outputs, Mapping) or hasattr(outputs, "to_tuple"):   # dict / ModelOutput
        items = [(str(k), v) for k, v in outputs.items() if v is not None]
    elif isinstance(outputs, (tuple, list)):
        fields = getattr(outputs, "_fields", None)   # a namedtuple names its entries
        items = [(fields[i] if fields else f"{SINGLE_OUTPUT}_{i}", v)
                 for i, v in enumerate(outputs) if v is not None]
    else:
        raise TypeError(f"model outputs of type {type(outputs).__name__} are not tensors; return "
                        "a tensor, a tuple / list / dict of tensors, or a ModelOutput")
    flat = []
    for name, value in items:
        flat.extend(flat_outputs(value, f"{prefix}_{name}" if prefix else name))
    return flat


def selected_output(outputs: Any, index: int = 0) -> torch.Tensor:
    """The output training losses read (`validate.output`; the first by default)."""
    flat = flat_outputs(outputs)
    return flat[min(index, len(flat) - 1)][1]


def named_numpy(outputs: list[tuple[str, torch.Tensor]]) -> Arrays:
    arrays = [(name, (t.float() if t.is_floating_point() else t).detach().numpy())
              for name, t in outputs]
    return arrays[0][1] if len(arrays) == 1 else dict(arrays)


class FlatIO(torch.nn.Module):
    """`model` with positional tensor inputs named `names` and a flat tuple of tensor outputs
    (one tensor when there is one), which torch.export and the ONNX / TFLite exporters handle
    alike. The names become the exported graph's placeholder (and the artifacts' input) names."""

    def __init__(self, model: torch.nn.Module, names: Sequence[str]) -> None:
        super().__init__()
        self.model = model

        def forward(self: FlatIO, *inputs: torch.Tensor) -> Any:
            flat = [tensor for _, tensor in flat_outputs(call(self.model, inputs, names))]
            return flat[0] if len(flat) == 1 else tuple(flat)

        positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
        # torch.export names placeholders after forward()'s signature
        forward.__signature__ = inspect.Signature(
            [inspect.Parameter(name, positional) for name in ("self", *names)])
        self.forward = forward.__get__(self)


def exportable(model: torch.nn.Module, example: list[torch.Tensor],
               names: Sequence[str]) -> torch.nn.Module:
    """`model` itself when it has one input and one tensor output, else FlatIO around it (a
    plain model keeps its module names, which int8 fallback and pruning refer to)."""
    if len(example) == 1 and (isinstance(model, torch.fx.GraphModule) or _tensor_out(model, example)):
        return model
    return FlatIO(model, list(names)[:len(example)])


def _tensor_out(model: torch.nn.Module, example: list[torch.Tensor]) -> bool:
    flags = {m: m.training for m in model.modules()}
    model.eval()   # a probe must not move BatchNorm statistics
    try:
        with torch.no_grad():
            return isinstance(model(*example), torch.Tensor)
    finally:
        for module, training in flags.items():
            module.training = training

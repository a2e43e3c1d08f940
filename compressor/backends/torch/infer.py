"""Inference-side helpers of the PyTorch backend: predictions, ModelInfo, example inputs."""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING
from collections.abc import Iterator

import torch

from compressor.backends.base import ModelInfo
from compressor.backends.torch.quant import converted, is_prepared
from compressor.backends.torch.io import (SINGLE_OUTPUT, as_tensors, call, feed_names,
                                          flat_outputs, input_names, named_numpy)
from compressor.backends.torch.train import is_exported, set_mode
from compressor.errors import DataError, first_line
from compressor.core.int8_mode import layer_kinds
from compressor.core.tensors import (Arrays, TensorSpec, concat, is_integer, is_named, specs_of, take)
from compressor.core.tensors import rows as rows_of

if TYPE_CHECKING:
    from compressor.core.context import Context

SINGLE_INPUT = "input"   # the name of the one input of a model fed one array
# an exported program's shape guards fail with AssertionError
RUN_ERRORS = (RuntimeError, TypeError, ValueError, IndexError, AssertionError)


def predict(model: torch.nn.Module, x: Arrays, batch_size: int = 256) -> Arrays:
    """Every output as numpy (one array, or a dict name -> array), in eval mode, no gradients."""
    # A prepared int8 graph is run as its converted int8 copy: its observers would otherwise
    # keep recording, and the converted graph is exactly what the artifacts compute.
    quantized = is_prepared(model)
    runnable = converted(model) if quantized else model
    names = feed_names(runnable, x)
    inputs = as_tensors(runnable, x, names)
    batches = []
    with (torch.no_grad() if quantized else _inference(runnable)):
        for batch in zip(*(t.split(batch_size) for t in inputs)):
            batches.append(named_numpy(flat_outputs(call(runnable, batch, names))))
    return concat(batches)


def describe(model: torch.nn.Module, example: Arrays | None = None) -> ModelInfo:
    """Params and named I/O; an nn.Module declares no input shape, so `example` rows (whose
    dtypes are the inputs' dtypes: integer ids stay integers) are run once."""
    params = sum(p.numel() for p in model.parameters())
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    declared = _exported_signature(model)
    if example is None:
        if declared is None:
            raise DataError(f"describing a {type(model).__name__} needs example inputs (a few "
                            "rows of data): a PyTorch module does not declare its input shape")
        return ModelInfo(params, *declared, size, layer_kinds(_layer_names(model)))
    rows = take(example, slice(0, 2))
    names = input_names(model)
    given = specs_of(rows, SINGLE_INPUT)
    try:
        outputs = predict(model, rows)
    except RUN_ERRORS as exc:
        takes = ("; ".join(spec.describe() for spec in declared[0]) if declared
                 else ", ".join(names))
        raise DataError(f"the model cannot run inputs {'; '.join(g.describe() for g in given)} "
                        f"({first_line(exc)}); it takes {takes}: check the data's shapes, "
                        f"dtypes and names{_layout_hint(given)}") from None
    inputs = declared[0] if declared else _named_like(given, names, rows)
    return ModelInfo(params, inputs, specs_of(outputs, SINGLE_OUTPUT), size,
                     layer_kinds(_layer_names(model)))


def _layer_names(model: torch.nn.Module) -> list[str]:
    """Module class names; for an exported graph, its op names too."""
    names = [type(m).__name__ for m in model.modules()]
    if is_exported(model):
        names += [str(node.target) for node in model.graph.nodes if node.op == "call_function"]
    return names


def _named_like(given: tuple[TensorSpec, ...], names: list[str], rows: Arrays) -> tuple:
    """The data's specs under forward()'s names when the data matched them by position."""
    if is_named(rows) and not set(names) >= set(rows):
        return tuple(TensorSpec(name, g.shape, g.dtype) for name, g in zip(names, given))
    return given


def _layout_hint(given: tuple[TensorSpec, ...]) -> str:
    images = any(len(g.shape) == 4 and not is_integer(g.dtype) for g in given)
    return " (PyTorch images are NCHW: N, channels, height, width)" if images else ""


def example_input(ctx: Context, count: int) -> Arrays:
    """A few real input rows for tracing (exporters need one example batch)."""
    for split in (ctx.data.val, ctx.data.train):
        if split is not None and rows_of(split[0]) >= count:
            return take(split[0], slice(0, count))
    raise DataError(f"exporting a PyTorch model traces it on {count} input rows, but "
                    f"{ctx.data.name} has fewer; pass more validation data")


def _exported_signature(model: torch.nn.Module):
    """(input specs, output specs) read from an exported graph, None for nn.Modules."""
    if not is_exported(model):
        return None
    placeholders = [n for n in model.graph.nodes if n.op == "placeholder" and "val" in n.meta]
    outputs = [n for n in model.graph.nodes if n.op == "output"]
    if not placeholders or not outputs:
        return None
    flat_out = _flat_nodes(outputs[0].args[0])
    if any("val" not in getattr(node, "meta", {}) for node in flat_out):
        return None
    inputs = tuple(_spec(n.name, n.meta["val"]) for n in placeholders)
    names = [SINGLE_OUTPUT] if len(flat_out) == 1 else \
        [f"{SINGLE_OUTPUT}_{i}" for i in range(len(flat_out))]
    return inputs, tuple(_spec(name, n.meta["val"]) for name, n in zip(names, flat_out))


def _flat_nodes(value) -> list:
    if isinstance(value, (tuple, list)):
        return [node for item in value for node in _flat_nodes(item)]
    return [value]


def _spec(name: str, value) -> TensorSpec:
    return TensorSpec(name, _static(value.shape), str(value.dtype).removeprefix("torch."))


def _static(shape) -> tuple[int | None, ...]:
    return tuple(dim if isinstance(dim, int) else None for dim in shape)


@contextlib.contextmanager
def _inference(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode and no gradients; a plain module gets its train/eval flags back afterwards."""
    flags = {} if is_exported(model) else {m: m.training for m in model.modules()}
    set_mode(model, training=False)
    try:
        with torch.no_grad():
            yield
    finally:
        for module, training in flags.items():
            module.training = training

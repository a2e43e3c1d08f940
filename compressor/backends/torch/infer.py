"""Inference-side helpers of the PyTorch backend: predictions, ModelInfo, example inputs."""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING
from collections.abc import Iterator

import numpy as np
import torch

from compressor.backends.base import ModelInfo
from compressor.backends.torch.quant import converted, is_prepared
from compressor.backends.torch.train import as_tensor, first_output, is_exported, set_mode
from compressor.errors import DataError, first_line

if TYPE_CHECKING:
    from compressor.context import Context

INTEGER_INPUT_MODULES = (torch.nn.Embedding, torch.nn.EmbeddingBag)
RUN_ERRORS = (RuntimeError, TypeError, ValueError, IndexError)


def predict(model: torch.nn.Module, x: np.ndarray, batch_size: int = 256) -> np.ndarray:
    """First-output logits as numpy, in eval mode and without gradients."""
    # A prepared int8 graph is run as its converted int8 copy: its observers would otherwise
    # keep recording, and the converted graph is exactly what the artifacts compute.
    quantized = is_prepared(model)
    runnable = converted(model) if quantized else model
    outputs = []
    with (torch.no_grad() if quantized else _inference(runnable)):
        for batch in as_tensor(x).split(batch_size):
            out = first_output(runnable(batch)).detach()
            outputs.append((out.float() if out.is_floating_point() else out).numpy())
    return np.concatenate(outputs)


def describe(model: torch.nn.Module, example: np.ndarray | None = None) -> ModelInfo:
    """Params and I/O; an nn.Module declares no input shape, so `example` rows are run once."""
    params = sum(p.numel() for p in model.parameters())
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    declared = _exported_signature(model)
    if example is None:
        if declared is None:
            raise DataError(f"describing a {type(model).__name__} needs example inputs (a few "
                            "rows of data): a PyTorch module does not declare its input shape")
        (input_shape, input_dtype), output_shape = declared
        return ModelInfo(params, input_shape, input_dtype, output_shape, size)
    input_dtype = declared[0][1] if declared else expected_input_dtype(model)
    rows = np.asarray(example)[:2]
    try:
        output = predict(model, rows.astype(input_dtype))
    except RUN_ERRORS as exc:
        raise DataError(f"the model cannot run inputs of shape (N, {', '.join(map(str, rows.shape[1:]))})"
                        f" ({first_line(exc)}); check the data's shape and layout (PyTorch images are "
                        "NCHW: N, channels, height, width)") from None
    input_shape = declared[0][0] if declared else (None, *rows.shape[1:])
    return ModelInfo(params, input_shape, input_dtype, (None, *output.shape[1:]), size)


def expected_input_dtype(model: torch.nn.Module) -> str:
    """int64 when the first layer is an embedding (token ids), float32 otherwise."""
    for module in model.modules():
        if next(module.parameters(recurse=False), None) is not None:
            return "int64" if isinstance(module, INTEGER_INPUT_MODULES) else "float32"
    return "float32"


def example_input(ctx: Context, rows: int) -> np.ndarray:
    """A few real input rows for tracing (exporters need one example batch)."""
    for split in (ctx.data.val, ctx.data.train):
        if split is not None and len(split[0]) >= rows:
            return np.asarray(split[0][:rows])
    raise DataError(f"exporting a PyTorch model traces it on {rows} input rows, but "
                    f"{ctx.data.name} has fewer; pass more validation data")


def _exported_signature(model: torch.nn.Module):
    """((input_shape, dtype), output_shape) read from an exported graph, None for nn.Modules."""
    if not is_exported(model):
        return None
    placeholders = [n for n in model.graph.nodes if n.op == "placeholder" and "val" in n.meta]
    outputs = [n for n in model.graph.nodes if n.op == "output"]
    if not placeholders or not outputs:
        return None
    value = placeholders[0].meta["val"]
    first_out = outputs[0].args[0]
    while isinstance(first_out, (tuple, list)):
        first_out = first_out[0]
    out_value = getattr(first_out, "meta", {}).get("val")
    if out_value is None:
        return None
    dtype = str(value.dtype).removeprefix("torch.")
    return (_static(value.shape), dtype), _static(out_value.shape)


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

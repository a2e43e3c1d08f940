"""PyTorch model state -> .tflite with litert-torch: float32, float16 weights, full int8
(ptq / qat), or int8 weights (dynamic / weight_only); one function per scheme, which the
handlers in handlers.py call.

The artifact has a batch of 1, as on device: litert-torch 0.10 cannot lower a dynamic batch
(`dynamic_shapes={0: Dim}` fails in its MLIR lowering on a CNN's flatten and on a DistilBERT
alike). LiteRT runs larger batches row by row; made_by says the batch is fixed. The input
and output tensors carry the signature's names (the model's argument and output names).

int8 is the route probed on the pinned stack (torch 2.13, litert-torch 0.10): the PT2E graph
converted with `fold_quantize=False`,
then `litert_torch.convert(..., quant_config=QuantConfig(pt2e_quantizer=...))`. That config
only tells the converter the graph is statically quantized (its q/dq ops carry the ranges);
litert's own quantizer cannot prepare QAT, so the model is prepared by torchao's.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any
from collections.abc import Iterator

import numpy as np

from compressor.backends.torch.env import import_litert_torch
from compressor.backends.torch.quant import converted
from compressor.backends.torch.io import as_tensors, exportable
from compressor.backends.torch.train import set_mode
from compressor.core.tensors import take
from compressor.errors import BackendUnavailableError, first_line
from compressor.export.tflite import float16_weights, int8_weights, renamed_signature
from compressor.export.tflite_tables import int8_tables
from compressor.core.quiet import captured_native_output, log_tail

if TYPE_CHECKING:
    from compressor.core.context import Context, ModelState
    from compressor.schemes import Float16, Float32, Int8Scheme
    from compressor.core.tensors import Arrays

CONVERT_ERRORS = (RuntimeError, TypeError, ValueError, NotImplementedError, KeyError,
                  AttributeError, IndexError)


def tflite_float32(state: ModelState, scheme: Float32, path: Path, ctx: Context,
                   example: Arrays) -> Path:
    import_litert_torch()
    names, sample, log = _inputs(state, ctx, example)
    content = _float_converted(state, names, sample, log, None, "float32")
    return _written(content, path, ctx, names, sample)


def tflite_float16(state: ModelState, scheme: Float16, path: Path, ctx: Context,
                   example: Arrays) -> Path:
    import_litert_torch()
    names, sample, log = _inputs(state, ctx, example)
    content = _float_converted(state, names, sample, log, _float16_config(scheme), "float16")
    return _written(content, path, ctx, names, sample)


def tflite_int8_static(state: ModelState, scheme: Int8Scheme, path: Path, ctx: Context,
                       example: Arrays) -> Path:
    """ptq / qat: the PT2E graph converted with its q/dq ops, which carry the int8 ranges."""
    import_litert_torch()
    names, sample, log = _inputs(state, ctx, example)
    float_io = scheme.io_dtype == "float32"
    module = converted(state.model, fold_quantize=False)
    content = _convert(module, sample, _static_int8_config(), log, "int8", float_io)
    if float_io:
        _require_float_io(content)
    if state.float_layers and scheme.fallback_dtype == "float16":
        # In an int8 model every float32 kernel weight is one of the fallback's layers.
        content = float16_weights(content, lambda weight: True)
    return _written(content, path, ctx, names, sample)


def tflite_int8_weights(state: ModelState, scheme: Int8Scheme, path: Path, ctx: Context,
                        example: Arrays) -> Path:
    """dynamic / weight_only: the float model converted, its weights int8 by ai-edge-quantizer."""
    import_litert_torch()
    names, sample, log = _inputs(state, ctx, example)
    content = int8_weights(_float_converted(state, names, sample, log, None, "float32"),
                           scheme.method)
    content = int8_tables(content)   # position tables ai-edge-quantizer leaves float32
    return _written(content, path, ctx, names, sample)


def _inputs(state: ModelState, ctx: Context, example: Arrays) -> tuple[list[str], tuple, Path]:
    """The model's input names, its one-row tracing sample, and the converter's log."""
    names = [spec.name for spec in ctx.inputs] or ["input"]
    sample = tuple(as_tensors(state.model, take(example, slice(0, 1)), names))
    return names, sample, Path(ctx.workdir) / "logs" / "tflite-convert.log"


def _float_converted(state: ModelState, names: list[str], sample: tuple, log: Path,
                     quant_config: Any, kind: str) -> bytes:
    set_mode(state.model, training=False)
    return _convert(exportable(state.model, list(sample), names), sample, quant_config, log, kind)


def _written(content: bytes, path: Path, ctx: Context, names: list[str], sample: tuple) -> Path:
    # litert-torch numbers the signature's entries args_0.. / output_0.. in the model's order
    outputs = [spec.name for spec in ctx.outputs] or ["output"]
    numbered = {**{f"args_{i}": name for i, name in enumerate(names[:len(sample)])},
                **{f"output_{i}": name for i, name in enumerate(outputs)}}
    path.write_bytes(_io_tensors_named(renamed_signature(content, numbered)))
    return path


def _io_tensors_named(content: bytes) -> bytes:
    """The input / output tensors named as their signature entries (`input_ids`, `logits`):
    litert-torch names them `serving_default_args_0`, `serving_default_output_0_output`,
    which is what tools listing the tensors (get_input_details, Netron) show."""
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model_from_bytearray(bytearray(content))
    if len(model.signatureDefs or []) != 1:
        return content
    signature = model.signatureDefs[0]
    tensors = model.subgraphs[signature.subgraphIndex].tensors
    for entry in (*signature.inputs, *signature.outputs):
        tensors[entry.tensorIndex].name = entry.name if isinstance(entry.name, bytes) \
            else entry.name.encode()
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def _convert(module: Any, sample: tuple, quant_config: Any, log: Path, kind: str,
             keep_boundary_qdq: bool = False) -> bytes:
    import litert_torch

    try:
        with captured_native_output(log, f"TFLite {kind}"), \
                (_boundary_qdq_kept() if keep_boundary_qdq else contextlib.nullcontext()):
            return litert_torch.convert(module, sample, quant_config=quant_config).model_content()
    except CONVERT_ERRORS as exc:
        raise BackendUnavailableError(
            f"TFLite {kind} conversion failed: {first_line(exc)}\n{log_tail(log)}\n(full log: {log}); "
            "an op litert-torch does not support is the usual cause: replace it, or export "
            "onnx only") from None


def _static_int8_config() -> Any:
    from litert_torch.quantize import pt2e_quantizer
    from litert_torch.quantize.quant_config import QuantConfig

    flag = pt2e_quantizer.PT2EQuantizer().set_global(
        pt2e_quantizer.get_symmetric_quantization_config(is_per_channel=True))
    return QuantConfig(pt2e_quantizer=flag)


def _float16_config(scheme: Float16) -> Any:
    if scheme.exclude:
        raise BackendUnavailableError("the TFLite float16 conversion cannot keep chosen layers in "
                                      "float32; remove `exclude` or export onnx only")
    if not scheme.keep_io_types:
        raise BackendUnavailableError("TFLite float16 artifacts always keep float32 inputs and "
                                      "outputs; set keep_io_types: true or export onnx only")
    # Weight-only float16 (a DEQUANTIZE per weight), applied by ai-edge-quantizer after
    # conversion; the recipe's "generative" name is historical, it works on any model.
    from litert_torch.generative.quantize import quant_recipes

    return quant_recipes.full_fp16_recipe()


@contextlib.contextmanager
def _boundary_qdq_kept() -> Iterator[None]:
    """Keep the graph's first QUANTIZE and last DEQUANTIZE ops: float32 inputs and outputs.

    litert-torch 0.10's converter folds them into int8 I/O and offers no option against it;
    its V2 converter (which needs a newer TensorFlow) sets strict_qdq_mode, which keeps them.
    The same flag is set here on the V1 config for the duration of one conversion, and the
    result is checked (`_require_float_io`), so a converter that ignores it fails loudly.
    """
    from litert_torch._convert import litert_converter

    api = litert_converter.converter_api_ext
    original = api.ConvertToTFLConfig

    def strict_config() -> Any:
        config = original()
        config.strict_qdq_mode = True
        return config

    api.ConvertToTFLConfig = strict_config
    try:
        yield
    finally:
        api.ConvertToTFLConfig = original


def _require_float_io(content: bytes) -> None:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=content)
    details = interpreter.get_input_details() + interpreter.get_output_details()
    # integer ids and masks stay integers; only quantized (int8 / uint8) I/O is refused
    not_float = [d["name"] for d in details if d["dtype"] in (np.int8, np.uint8)]
    if not_float:
        raise BackendUnavailableError(
            f"the int8 TFLite has non-float32 inputs/outputs ({', '.join(not_float)}) although "
            "float32 I/O was asked for; set the quantize step's io_dtype: int8, or export onnx only")

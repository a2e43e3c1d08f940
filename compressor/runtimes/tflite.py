"""Run and inspect .tflite artifacts with LiteRT (ai-edge-litert), or tflite-runtime on device
images where only that is installed. TensorFlow is never needed.

Inspection reads the model through an interpreter built without delegates and never
allocated: its op list is then the model's own (no XNNPACK DELEGATE node), and only the
constant tensors have data, which `get_tensor` returns with the dtype stored in the file
(float16 for fp16 artifacts, int8 for quantized kernels).
"""
from __future__ import annotations

from collections import Counter
from importlib import metadata
from pathlib import Path

import numpy as np

from compressor.errors import BackendUnavailableError, ModelLoadError
from compressor.core.kernel_ops import TFLITE_KERNEL_INPUTS, TFLITE_PASSTHROUGH
from compressor.core.quiet import muted_native_output
from compressor.runtimes.base import ArtifactInfo, SampleShapes, WeightTensor
from compressor.runtimes.tflite_shapes import (fully_connected_rows, signature_ordered,
                                               sized_to_samples)
from compressor.runtimes.macs import kernel_macs
from compressor.runtimes.common import (
    RUNTIME_OVERHEAD_BYTES,
    as_input_list,
    count_zeros,
    default_threads,
    file_facts,
    find_kernels,
    fixed_batch_of,
    peak_live_bytes,
    predict_in_batches,
    time_calls,
    weight_summary,
)

# ops whose constant inputs (weights, bias) LiteRT's default XNNPACK delegate repacks into its own buffers
XNNPACK_PACKED = {"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "TRANSPOSE_CONV"}


def _litert():
    """(Interpreter class, OpResolverType, "package version") of the installed runtime."""
    for package, module in (("ai-edge-litert", "ai_edge_litert.interpreter"),
                            ("tflite-runtime", "tflite_runtime.interpreter")):
        try:
            mod = __import__(module, fromlist=["Interpreter"])
        except ImportError:
            continue
        try:
            version = metadata.version(package)
        except metadata.PackageNotFoundError:
            version = "unknown"
        return mod.Interpreter, mod.OpResolverType, f"{package} {version}"
    raise BackendUnavailableError(
        "running .tflite artifacts needs LiteRT: pip install ai-edge-litert "
        "(on device images: pip install tflite-runtime, which needs numpy<2)")


def _open(path: Path, threads: int | None = None, delegates: bool = True):
    interpreter_cls, resolver, name = _litert()
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"{path}: no such file")
    kwargs = {} if delegates else {"experimental_op_resolver_type": resolver.BUILTIN_WITHOUT_DEFAULT_DELEGATES}
    try:
        return interpreter_cls(model_path=str(path), num_threads=threads, **kwargs), name
    except (ValueError, RuntimeError) as e:
        raise ModelLoadError(f"{path}: not a valid TFLite model ({e}); re-export it") from e


def _quantization(detail: dict) -> tuple[float, int]:
    scale, zero_point = detail["quantization"]
    return float(scale), int(zero_point)


class TFLiteRuntime:
    """A .tflite artifact in a LiteRT interpreter (with its default XNNPACK delegate)."""

    def __init__(self, path: Path, threads: int | None = None):
        self.path = Path(path)
        self.threads = default_threads(threads)
        self._interp, self.name = _open(self.path, self.threads)
        try:
            with muted_native_output():   # the delegate announces itself on stdout
                self._interp.allocate_tensors()
        except (ValueError, RuntimeError) as e:   # e.g. Select TF ops / custom ops not linked in
            raise ModelLoadError(f"{self.path}: {self.name} cannot prepare this model ({e}); "
                                 "export it with TFLite builtin ops only") from e
        self._inputs, self._input_names = signature_ordered(
            self._interp, self._interp.get_input_details(), "inputs")
        self._outputs, self.output_names = signature_ordered(
            self._interp, self._interp.get_output_details(), "outputs")
        dynamic = all(len(d["shape_signature"]) and d["shape_signature"][0] == -1 for d in self._inputs)
        # a model exported with a fixed batch (often 1) must get exactly that many rows
        self._fixed_batch = None if dynamic else int(self._inputs[0]["shape"][0])
        self._batch = int(self._inputs[0]["shape"][0]) if len(self._inputs[0]["shape"]) else None

    def _set_batch(self, n: int) -> None:
        if n == self._batch or self._fixed_batch:
            return
        for d in self._inputs:
            self._interp.resize_tensor_input(d["index"], [n, *d["shape"][1:]])
        self._interp.allocate_tensors()
        self._batch = n

    @staticmethod
    def _to_input(x: np.ndarray, detail: dict) -> np.ndarray:
        dtype = np.dtype(detail["dtype"])
        scale, zero_point = _quantization(detail)
        if scale and np.issubdtype(dtype, np.integer) and np.issubdtype(x.dtype, np.floating):
            info = np.iinfo(dtype)   # int8 / uint8 I/O: quantize with the input tensor's own params
            return np.clip(np.round(x / scale + zero_point), info.min, info.max).astype(dtype)
        return np.ascontiguousarray(x, dtype=dtype)

    @staticmethod
    def _from_output(y: np.ndarray, detail: dict) -> np.ndarray:
        scale, zero_point = _quantization(detail)
        if scale and np.issubdtype(y.dtype, np.integer):
            return (y.astype(np.float32) - zero_point) * np.float32(scale)
        return y.astype(np.float32) if np.issubdtype(y.dtype, np.floating) else y

    def _feed(self, inputs: list[np.ndarray]) -> None:
        self._set_batch(len(inputs[0]))
        for d, x in zip(self._inputs, inputs):
            self._interp.set_tensor(d["index"], self._to_input(x, d))

    def _run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        self._feed(inputs)
        self._interp.invoke()
        return [self._from_output(self._interp.get_tensor(d["index"]), d) for d in self._outputs]

    def predict(self, x, batch_size: int = 64):
        """Float outputs for float inputs (one array, or a dict name -> array for several)."""
        inputs = as_input_list(x, self._input_names)
        return predict_in_batches(self._run, inputs, batch_size, self._fixed_batch,
                                  self.output_names)

    def latency_ms(self, x_one, warmup: int = 10, runs: int = 50) -> dict[str, float]:
        """p50 / p90 of set_tensor + invoke + get_tensor for one sample, after warm-up."""
        inputs = [a[:1] for a in as_input_list(x_one, self._input_names)]
        if self._fixed_batch and self._fixed_batch > 1:
            inputs = [np.repeat(a, self._fixed_batch, axis=0) for a in inputs]
        self._set_batch(len(inputs[0]))
        feeds = [(d["index"], self._to_input(x, d)) for d, x in zip(self._inputs, inputs)]
        interp, outs = self._interp, [d["index"] for d in self._outputs]

        def call():
            for index, value in feeds:
                interp.set_tensor(index, value)
            interp.invoke()
            return [interp.get_tensor(i) for i in outs]

        return time_calls(call, warmup, runs)


def _io(interp, details: list[dict], side: str) -> list[dict]:
    """Inputs or outputs under their signature names (what data and `validate.output` use, not
    the tensor names `serving_default_args_0`), with -1 for a dynamic dimension."""
    ordered, names = signature_ordered(interp, details, side)
    return [{"name": name, "shape": [int(s) for s in (d["shape_signature"] if len(d["shape_signature"])
                                                      else d["shape"])],
             "dtype": np.dtype(d["dtype"]).name} for d, name in zip(ordered, names)]


def inspect_tflite(path: Path, sample_shapes: SampleShapes | None = None) -> ArtifactInfo:
    """Weights, dtypes, sparsity, ops, I/O, sizes and memory estimate read from the file;
    `sample_shapes` (input name -> one sample's shape) sizes inputs whose dims are free, so
    the shapes MACs are counted on are the data's, as inspect_onnx counts them."""
    path = Path(path)
    interp, _ = _open(path, delegates=False)
    sized = sized_to_samples(interp, sample_shapes)
    try:
        op_details = interp._get_ops_details()
        tensors = {t["index"]: t for t in interp.get_tensor_details()}
    except (ValueError, RuntimeError) as e:
        raise ModelLoadError(f"{path}: cannot read the TFLite graph ({e})") from e
    ops = [(o["op_name"], [int(i) for i in o["inputs"] if i >= 0], [int(i) for i in o["outputs"]])
           for o in op_details]
    inputs, outputs = interp.get_input_details(), interp.get_output_details()
    graph_inputs = {d["index"] for d in inputs}
    produced = {t for _, _, outs in ops for t in outs}
    # constants: read by some op, written by none, and not fed by the caller
    constants = sorted({t for _, ins, _ in ops for t in ins} - produced - graph_inputs)
    kernels = find_kernels(ops, constants, TFLITE_KERNEL_INPUTS, TFLITE_PASSTHROUGH)
    readers: dict[int, str] = {}   # constant -> "OP output-name" of the first op reading it
    for op, ins, outs in ops:
        for t in ins:
            readers.setdefault(t, f"{op} {tensors[outs[0]]['name']}" if outs else op)

    weights, weight_bytes = [], {}
    for index in list(constants):
        detail = tensors[index]
        try:
            values = interp.get_tensor(index)
        except ValueError:   # no data in the file: a variable (state) tensor, not a weight
            constants.remove(index)
            continue
        q = detail["quantization_parameters"]
        zeros = count_zeros(values, q["zero_points"], q["quantized_dimension"])
        weights.append(WeightTensor(detail["name"], values.dtype.name, tuple(values.shape), zeros,
                                    index in kernels, readers.get(index, "")))
        weight_bytes[index] = values.nbytes

    def batch1_shape(t: dict) -> list[int]:
        shape = t["shape_signature"] if len(t["shape_signature"]) and not sized else t["shape"]
        return [max(int(s), 1) for s in shape]

    def batch1_bytes(t: dict) -> int:
        return int(np.prod(batch1_shape(t))) * np.dtype(t["dtype"]).itemsize

    constant_set = set(constants)
    activations = {i: batch1_bytes(t) for i, t in tensors.items() if i not in constant_set}
    # LiteRT dequantizes constant (e.g. fp16) weights once at prepare time and keeps the result
    persistent = {outs[0] for op, ins, outs in ops if op == "DEQUANTIZE" and set(ins) <= constant_set}
    peak = peak_live_bytes(ops, activations, graph_inputs, [d["index"] for d in outputs], persistent)
    # The interpreter mmaps the file, and packing reads every weight page, so the whole file is
    # resident; XNNPACK then keeps a packed copy of the constants its ops read directly. fp16
    # weights reach those ops through DEQUANTIZE: their float32 copies are the `persistent`
    # tensors, and converting each one goes through a temporary float32 buffer, the largest of
    # which counts once. Measured on float32 / int8 / fp16 MLPs of 4-50 MB (ai-edge-litert 2.3):
    # estimate - peak RSS growth = +0.8 to +1.0 MiB (the overhead's rounding up), but up to
    # +19% for fp16 with unequal layers (the temporaries come and go layer by layer, so the
    # largest one need not coincide with the whole packed set).
    packed = {t for op, ins, _ in ops if op in XNNPACK_PACKED for t in ins if t in weight_bytes}
    temporary = max((activations[t] for t in persistent), default=0)
    size, gzip_size, sha = file_facts(path)
    params, dtypes, sparsity = weight_summary(weights)
    shapes = {i: batch1_shape(t) for i, t in tensors.items() if i not in constant_set}
    macs = kernel_macs(ops, {t: [int(d) for d in tensors[t]["shape"]] for t in constants},
                       fully_connected_rows(ops, tensors, shapes), TFLITE_PASSTHROUGH)
    estimate = (size + sum(weight_bytes[t] for t in packed) + temporary + peak
                + RUNTIME_OVERHEAD_BYTES["tflite"])
    named_inputs = _io(interp, inputs, "inputs")
    return ArtifactInfo(
        format="tflite", path=path, size_bytes=size, gzip_bytes=gzip_size, sha256=sha,
        params=params, weight_dtypes=dtypes, sparsity=sparsity,
        ops=dict(Counter(op for op, _, _ in ops)), inputs=named_inputs,
        outputs=_io(interp, outputs, "outputs"), est_peak_memory_bytes=estimate, macs=macs,
        fixed_batch=fixed_batch_of(named_inputs),
        weights=tuple(weights))

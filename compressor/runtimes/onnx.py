"""Run .onnx artifacts with onnxruntime (CPU) and inspect them with the `onnx` package.

Weights are the graph's initializers plus Constant nodes. In a QDQ model the int8
initializer feeding a DequantizeLinear is the stored weight, and it is a kernel when that
DequantizeLinear's output is the weight input of a Conv / MatMul / Gemm.
Only the main graph is inspected; subgraphs of If / Loop / Scan are not walked.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from compressor.errors import BackendUnavailableError, ModelLoadError
from compressor.core.kernel_ops import ONNX_KERNEL_INPUTS, ONNX_PASSTHROUGH
from compressor.runtimes.base import ArtifactInfo, SampleShapes, WeightTensor
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
from compressor.runtimes.onnx_shapes import batch1_shapes, dims_of

# (consumer op, input index) -> (input index of that weight's zero point, default axis of a per-channel zp)
ZERO_POINT_INPUT = {("DequantizeLinear", 0): (2, 1), ("QLinearConv", 3): (5, 0),
                    ("QLinearMatMul", 0): (2, 0), ("QLinearMatMul", 3): (5, -1),
                    ("ConvInteger", 1): (3, 0), ("MatMulInteger", 0): (2, 0), ("MatMulInteger", 1): (3, -1)}
CONSTANT_ATTR_DTYPES = {"value_float": np.float32, "value_floats": np.float32,
                        "value_int": np.int64, "value_ints": np.int64}
ORT_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
              "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int16)": np.int16,
              "tensor(int8)": np.int8, "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_}


def _ort():
    try:
        import onnxruntime
    except ImportError as e:
        raise BackendUnavailableError("running .onnx artifacts needs onnxruntime: pip install onnxruntime") from e
    return onnxruntime


def _onnx():
    try:
        import onnx
    except ImportError as e:
        raise BackendUnavailableError("inspecting .onnx artifacts needs onnx: pip install onnx") from e
    return onnx


# onnxruntime's graph optimization levels, the default first: a file that crashes the runtime at
# one level is retried at the next (runtimes/isolated.py)
ORT_LEVELS = ("ORT_ENABLE_ALL", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_BASIC", "ORT_DISABLE_ALL")


class OnnxRuntime:
    """A .onnx artifact in an onnxruntime CPU InferenceSession, at graph optimization level
    `optimization` (one of ORT_LEVELS; default ORT_ENABLE_ALL, onnxruntime's own default)."""

    def __init__(self, path: Path, threads: int | None = None, optimization: str | None = None):
        ort = _ort()
        self.path = Path(path)
        self.threads = default_threads(threads)
        self.name = f"onnxruntime {ort.__version__}"
        self.optimization = optimization or ORT_LEVELS[0]
        if self.optimization not in ORT_LEVELS:
            raise ModelLoadError(f"unknown onnxruntime optimization level {optimization!r}; use "
                                 f"one of {', '.join(ORT_LEVELS)}")
        if not self.path.is_file():
            raise ModelLoadError(f"{self.path}: no such file")
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3   # errors only; warnings about unused initializers are noise
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, self.optimization)
        try:
            self._session = ort.InferenceSession(str(self.path), sess_options=options,
                                                 providers=["CPUExecutionProvider"])
        except Exception as e:   # onnxruntime raises its own pybind classes (InvalidProtobuf, Fail, ...)
            raise ModelLoadError(f"{self.path}: onnxruntime cannot load this model "
                                 f"({type(e).__name__}: {str(e).strip()[:300]}); re-export it") from e
        self._inputs = self._session.get_inputs()
        self._names = [i.name for i in self._inputs]
        self.output_names = [o.name for o in self._session.get_outputs()]
        first = self._inputs[0].shape[0] if self._inputs and self._inputs[0].shape else None
        # a model exported with a fixed batch must get exactly that many rows per run
        self._fixed_batch = first if isinstance(first, int) and first > 0 else None

    def _feed(self, inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
        return {i.name: np.ascontiguousarray(x, dtype=ORT_DTYPES.get(i.type, x.dtype))
                for i, x in zip(self._inputs, inputs)}

    def _run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        outputs = self._session.run(None, self._feed(inputs))
        return [y.astype(np.float32) if np.issubdtype(y.dtype, np.floating) else y for y in outputs]

    def predict(self, x, batch_size: int = 64):
        """Float outputs for float inputs (one array, or a dict name -> array for several)."""
        return predict_in_batches(self._run, as_input_list(x, self._names), batch_size,
                                  self._fixed_batch, self.output_names)

    def latency_ms(self, x_one, warmup: int = 10, runs: int = 50) -> dict[str, float]:
        """p50 / p90 of session.run on one sample, after warm-up."""
        inputs = [a[:1] for a in as_input_list(x_one, self._names)]
        if self._fixed_batch and self._fixed_batch > 1:
            inputs = [np.repeat(a, self._fixed_batch, axis=0) for a in inputs]
        feed, session = self._feed(inputs), self._session
        return time_calls(lambda: session.run(None, feed), warmup, runs)


def _load(path: Path):
    onnx = _onnx()
    from google.protobuf.message import DecodeError

    if not path.is_file():
        raise ModelLoadError(f"{path}: no such file")
    try:
        model = onnx.load(str(path))
    except (DecodeError, ValueError, OSError) as e:
        raise ModelLoadError(f"{path}: not a valid ONNX model ({e}); re-export it") from e
    if model.ir_version == 0 or not model.graph.node:   # random bytes can parse as an empty proto
        raise ModelLoadError(f"{path}: not a valid ONNX model (no IR version or no graph nodes); re-export it")
    return model


def _io(values, initializers: set[str]) -> list[dict]:
    onnx = _onnx()
    return [{"name": v.name, "shape": dims_of(v.type),
             "dtype": np.dtype(onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)).name}
            for v in values if v.name not in initializers]


def _constant_values(model) -> dict[str, np.ndarray]:
    """name -> array of every initializer and Constant node output."""
    onnx = _onnx()
    from onnx import numpy_helper

    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type != "Constant" or not node.attribute:
            continue
        attr = node.attribute[0]
        if attr.name == "value":
            values[node.output[0]] = numpy_helper.to_array(attr.t)
        elif attr.name in CONSTANT_ATTR_DTYPES:   # value_float(s) / value_int(s); strings are not weights
            values[node.output[0]] = np.asarray(onnx.helper.get_attribute_value(attr),
                                                dtype=CONSTANT_ATTR_DTYPES[attr.name])
    return values


def _zero_points(model, constants: dict[str, np.ndarray]) -> dict[str, tuple[np.ndarray, int]]:
    """Weight name -> (zero point, axis) for weights consumed by quantized ops."""
    found = {}
    for node in model.graph.node:
        axis_attr = next((a.i for a in node.attribute if a.name == "axis"), None)
        for index, name in enumerate(node.input):
            zp_index, axis = ZERO_POINT_INPUT.get((node.op_type, index), (None, 0))
            if zp_index is None or name not in constants:
                continue
            zp_name = node.input[zp_index] if len(node.input) > zp_index else ""
            zero_point = constants.get(zp_name, np.zeros(1))
            found[name] = (zero_point, axis_attr if axis_attr is not None else axis)
    return found


def inspect_onnx(path: Path, sample_shapes: SampleShapes | None = None) -> ArtifactInfo:
    """Weights, dtypes, sparsity, ops, I/O, sizes and memory estimate read from the file;
    `sample_shapes` (input name -> one sample's shape) fixes the free dims MACs depend on."""
    onnx = _onnx()
    path = Path(path)
    model = _load(path)
    graph = model.graph
    constants = _constant_values(model)
    compute = [(n.op_type, [i for i in n.input if i], [o for o in n.output if o])
               for n in graph.node if n.op_type != "Constant"]
    kernels = find_kernels(compute, constants, ONNX_KERNEL_INPUTS, ONNX_PASSTHROUGH)
    zero_points = _zero_points(model, constants)

    readers: dict[str, str] = {}   # constant -> "OpType node-name" of the first node reading it
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, f"{node.op_type} {node.name or node.output[0]}")
    weights = []
    for name, values in constants.items():
        zero_point, axis = zero_points.get(name, (0, 0))
        weights.append(WeightTensor(name, values.dtype.name, tuple(values.shape),
                                    count_zeros(values, zero_point, axis), name in kernels,
                                    readers.get(name, "")))
    weight_bytes = sum(v.nbytes for v in constants.values())

    shapes = batch1_shapes(model, sample_shapes)
    activations = {}
    for name, (dims, elem_type) in shapes.items():
        if name in constants or not elem_type:
            continue
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).itemsize
        known = dims is not None and all(d >= 0 for d in dims)
        activations[name] = int(np.prod(dims, dtype=np.int64)) * itemsize if known else 0
    inits = {t.name for t in graph.initializer}
    peak = peak_live_bytes(compute, activations, [v.name for v in graph.input if v.name not in inits],
                           [v.name for v in graph.output])

    # onnxruntime copies each initializer out of the parsed protobuf into its own buffer and then
    # frees the protobuf's copy, one initializer at a time: while loading, the weights plus the
    # largest initializer are resident; afterwards the weights (prepacked in place of the
    # originals) plus activations. Measured on float32 MLPs of 1-64 MB (onnxruntime 1.32):
    # estimate - peak RSS growth = +1.0 to +1.5 MiB.
    largest = max((v.nbytes for v in constants.values()), default=0)
    macs = kernel_macs(compute, _logical_shapes(graph, constants),
                       {name: dims for name, (dims, _) in shapes.items() if dims is not None},
                       ONNX_PASSTHROUGH, {n.output[0]: _attr(n, "equation", b"").decode()
                                          for n in graph.node if n.op_type == "Einsum"})
    size, gzip_size, sha = file_facts(path)
    params, dtypes, sparsity = weight_summary(weights)
    inputs = _io(graph.input, inits)
    return ArtifactInfo(
        format="onnx", path=path, size_bytes=size, gzip_bytes=gzip_size, sha256=sha,
        params=params, weight_dtypes=dtypes, sparsity=sparsity,
        ops=dict(Counter(n.op_type for n in graph.node)),
        inputs=inputs, outputs=_io(graph.output, set()), fixed_batch=fixed_batch_of(inputs),
        est_peak_memory_bytes=weight_bytes + max(largest, peak) + RUNTIME_OVERHEAD_BYTES["onnx"],
        macs=macs,
        weights=tuple(weights))


def _attr(node, name: str, default):
    onnx = _onnx()
    return next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name),
                default)


def _logical_shapes(graph, constants: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    """Constant -> the shape its MACs count: its own, but [N, K] for the packed B of
    MatMulNBits / MatMulBnb4 (the node's attributes)."""
    shapes = {name: tuple(v.shape) for name, v in constants.items()}
    for node in graph.node:
        if node.op_type in ("MatMulNBits", "MatMulBnb4") and len(node.input) > 1 \
                and node.input[1] in shapes:
            shapes[node.input[1]] = (int(_attr(node, "N", 0)), int(_attr(node, "K", 0)))
    return shapes

"""An .onnx file (or onnx.ModelProto) as the model a run compresses.

The user's file is only read: it is parsed into memory (with its external data, which must
lie inside the model's folder), checked with onnx.checker, and every later file is written
into the run's workdir. onnxruntime runs the user's file as it is for reference outputs.
"""
from __future__ import annotations

import copy
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from compressor.backends.base import ModelInfo
from compressor.core.int8_mode import layer_kinds
from compressor.errors import BackendUnavailableError, ModelLoadError, first_line
from compressor.core.kernel_ops import ONNX_KERNEL_INPUTS
from compressor.core.tensors import Arrays, TensorSpec

QUANTIZABLE_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
# Beyond this, a protobuf cannot be serialized in one piece: weights go to an external file.
SINGLE_FILE_LIMIT = 1_800_000_000


@dataclass(eq=False)
class OnnxModel:
    """A float ONNX graph in memory (external data loaded, every node named) and the file it
    came from, if any, which is never written to."""

    proto: Any
    source: Path | None = None
    files: dict[Path, Path] = field(default_factory=dict)   # workdir -> float32 copy there

    def float32_file(self, workdir: Path) -> Path:
        """The float32 graph as a file in `workdir` (written once per run)."""
        path = self.files.get(Path(workdir))
        if path is None or not path.is_file():
            path = Path(workdir) / "onnx-input" / "float32.onnx"
            path.parent.mkdir(parents=True, exist_ok=True)
            write_onnx(self.proto, path)
            self.files[Path(workdir)] = path
        return path


def onnx_module() -> Any:
    try:
        import onnx
    except ImportError:
        raise BackendUnavailableError("ONNX models need the onnx and onnxruntime packages: pip "
                                      "install compressor[runtimes]") from None
    return onnx


def load_onnx(source: Any) -> OnnxModel:
    onnx = onnx_module()
    if isinstance(source, onnx.ModelProto):
        proto = copy.deepcopy(source)
        if any(onnx.external_data_helper.uses_external_data(t) for t in _tensors(proto)):
            raise ModelLoadError("this in-memory ModelProto keeps its weights in external files; "
                                 "pass the path of the .onnx file instead")
        _check(proto, "the in-memory ModelProto")
        return OnnxModel(_named_nodes(proto))
    if not isinstance(source, (str, Path)):
        raise ModelLoadError(f"cannot load a {type(source).__qualname__} as an ONNX model; pass "
                             "an .onnx path or an onnx.ModelProto")
    path = Path(source)
    if not path.is_file():
        raise ModelLoadError(f"model {path} does not exist; check the path")
    proto = _parsed(path)
    _load_external_data(proto, path)
    _check(proto, str(path), path if _weight_bytes(proto) > SINGLE_FILE_LIMIT else None)
    return OnnxModel(_named_nodes(proto), source=path)


def _parsed(path: Path) -> Any:
    onnx = onnx_module()
    from google.protobuf.message import DecodeError

    try:
        proto = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, OSError, RuntimeError) as exc:
        raise ModelLoadError(f"{path}: not a valid ONNX model ({first_line(exc)}); export it "
                             "again") from None
    if proto.ir_version == 0 or not proto.graph.node:   # random bytes can parse as a proto
        raise ModelLoadError(f"{path}: not a valid ONNX model (no IR version or no graph "
                             "nodes); export it again")
    return proto


def _load_external_data(proto: Any, path: Path) -> None:
    """Read external weights, refusing locations outside the model's folder (a crafted file
    could otherwise make compressor read any file the user can)."""
    onnx = onnx_module()
    folder = path.resolve().parent
    for tensor in _tensors(proto):
        if not onnx.external_data_helper.uses_external_data(tensor):
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        target = (folder / location).resolve()
        if not location or not target.is_relative_to(folder) or not target.is_file():
            raise ModelLoadError(f"{path}: tensor {tensor.name!r} keeps its data in "
                                 f"{location!r}, which is not a file inside {folder}; keep "
                                 "external data files next to the .onnx file")
    try:
        onnx.external_data_helper.load_external_data_for_model(proto, str(folder))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: cannot read its external data ({first_line(exc)}); "
                             "export the model again") from None


def _check(proto: Any, what: str, path: Path | None = None) -> None:
    onnx = onnx_module()
    try:
        onnx.checker.check_model(str(path) if path is not None else proto)
    except (onnx.checker.ValidationError, ValueError) as exc:
        raise ModelLoadError(f"{what}: onnx.checker rejects it ({first_line(exc)}); export the "
                             "model again") from None


def _tensors(proto: Any) -> list[Any]:
    onnx = onnx_module()
    return list(onnx.external_data_helper._get_all_tensors(proto))


def _named_nodes(proto: Any) -> Any:
    """Unnamed nodes get unique names: the quantize fallback keeps nodes float by name."""
    taken = {node.name for node in proto.graph.node if node.name}
    for index, node in enumerate(proto.graph.node):
        if not node.name:
            name = f"{node.op_type}_{index}"
            while name in taken:
                name += "_"
            node.name = name
            taken.add(name)
    return proto


def _weight_bytes(proto: Any) -> int:
    return sum(len(t.raw_data) for t in proto.graph.initializer)


def write_onnx(proto: Any, path: Path) -> Path:
    """Save `proto`, its weights in an external file beside it when one file cannot hold them."""
    onnx = onnx_module()
    large = _weight_bytes(proto) > SINGLE_FILE_LIMIT
    onnx.save(proto, str(path), save_as_external_data=large,
              location=f"{path.name}.data" if large else None)
    return path


def tensor_specs(values: Any, skip: set[str]) -> tuple[TensorSpec, ...]:
    """Graph inputs or outputs as TensorSpecs (batch dimension None, symbolic dims None)."""
    onnx = onnx_module()
    specs = []
    for value in values:
        if value.name in skip:
            continue
        tensor = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim)
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)).name
        specs.append(TensorSpec(value.name, (None, *dims[1:]) if dims else (), dtype))
    return tuple(specs)


def describe_onnx(model: OnnxModel) -> ModelInfo:
    from onnx import numpy_helper

    graph = model.proto.graph
    initializers = {init.name for init in graph.initializer}
    weights = [numpy_helper.to_array(init) for init in graph.initializer]
    return ModelInfo(params=sum(int(w.size) for w in weights if w.dtype.kind == "f"),
                     inputs=tensor_specs(graph.input, initializers),
                     outputs=tensor_specs(graph.output, set()),
                     size_bytes=sum(int(w.nbytes) for w in weights),
                     layer_kinds=layer_kinds(node.op_type for node in graph.node))


def predict_onnx(model: OnnxModel, x: Arrays, batch_size: int = 256) -> Arrays:
    """The model's outputs in onnxruntime: the user's file as it is, or the in-memory proto
    written to a temporary file for the duration of the call."""
    from compressor.runtimes.onnx import OnnxRuntime

    if model.source is not None:
        return OnnxRuntime(model.source).predict(x, batch_size)
    with tempfile.TemporaryDirectory(prefix="compressor-onnx-") as folder:
        path = write_onnx(model.proto, Path(folder) / "model.onnx")
        return OnnxRuntime(path).predict(x, batch_size)


def quantizable_nodes(proto: Any) -> list[str]:
    """Conv / MatMul / Gemm nodes with a constant weight: what int8 quantizes, and what the
    quantize fallback may keep float (by node name)."""
    constants = {init.name for init in proto.graph.initializer} | {
        out for node in proto.graph.node if node.op_type == "Constant" for out in node.output}
    return [node.name for node in proto.graph.node if node.op_type in QUANTIZABLE_OPS
            and any(i < len(node.input) and node.input[i] in constants
                    for i in ONNX_KERNEL_INPUTS[node.op_type])]
